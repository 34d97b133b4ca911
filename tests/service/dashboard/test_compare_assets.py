"""The dashboard's assets (the compare view split it into JS modules): every module one
imports is served, as JavaScript, and revalidated so that a browser never mixes versions."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from trainctl.service.routes.dashboard import STATIC_DIR

IMPORT = re.compile(r'^import .* from "\./([\w-]+\.js)";$', re.MULTILINE)


def test_every_imported_module_is_served_as_javascript_and_revalidated(
    client: TestClient,
) -> None:
    modules = {"dashboard.js"}
    for path in STATIC_DIR.glob("*.js"):
        modules |= set(IMPORT.findall(path.read_text(encoding="utf-8")))

    for module in sorted(modules):
        response = client.get(f"/static/{module}")
        assert response.status_code == 200, module
        assert response.headers["content-type"].startswith("text/javascript"), module
        assert response.headers["cache-control"] == "no-cache", module
        etag = {"If-None-Match": response.headers["etag"]}
        assert client.get(f"/static/{module}", headers=etag).status_code == 304
    assert {"compare.js", "run.js", "runs.js", "charts.js"} <= modules
