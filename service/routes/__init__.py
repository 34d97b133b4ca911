"""The API's routers, one module per noun."""

from service.routes import checkpoints, runs, system

__all__ = ["checkpoints", "runs", "system"]
