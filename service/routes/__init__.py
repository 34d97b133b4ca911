"""The API's routers, one module per noun."""

from trainctl.service.routes import checkpoints, runs, system

__all__ = ["checkpoints", "runs", "system"]
