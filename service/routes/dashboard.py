"""The web dashboard and the API docs: static pages and their assets (no build step, no CDN).

The pages hold no data: they read the API with the token the user types in, so they are
served without one. Plain Starlette routes, not API operations: the OpenAPI schema describes
the API. The docs are Swagger UI, vendored (static/vendor), on /openapi.json: FastAPI's own
/docs loads it from a CDN with an inline script, which the CSP blocks and an offline node
cannot reach.
"""

from __future__ import annotations

import os
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
NO_CACHE = {"Cache-Control": "no-cache"}


class RevalidatedStaticFiles(StaticFiles):
    """Static files a browser revalidates on every load (a 304 when unchanged).

    The dashboard is several JS modules that import each other: after an upgrade, a browser
    that guessed a freshness lifetime from Last-Modified could mix cached old modules with
    new ones.
    """

    def file_response(
        self,
        full_path: str | os.PathLike[str],
        stat_result: os.stat_result,
        scope: Scope,
        status_code: int = 200,
    ) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update(NO_CACHE)
        return response


async def read_dashboard(request: Request) -> FileResponse:
    """The dashboard page."""
    return FileResponse(STATIC_DIR / "index.html", headers=NO_CACHE)


async def read_docs(request: Request) -> FileResponse:
    """The API docs page."""
    return FileResponse(STATIC_DIR / "docs.html", headers=NO_CACHE)


def mount_dashboard(app: FastAPI) -> None:
    app.add_route("/", read_dashboard, methods=["GET"], include_in_schema=False)
    app.add_route("/docs", read_docs, methods=["GET"], include_in_schema=False)
    app.mount("/static", RevalidatedStaticFiles(directory=STATIC_DIR), name="static")
