"""The web dashboard: one static page and its assets (no build step, no CDN).

The page holds no data: it reads the API with the token the user types in, so it is served
without one. Plain Starlette routes, not API operations: the OpenAPI schema describes the API.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"


async def read_dashboard(request: Request) -> FileResponse:
    """The dashboard page."""
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


def mount_dashboard(app: FastAPI) -> None:
    app.add_route("/", read_dashboard, methods=["GET"], include_in_schema=False)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
