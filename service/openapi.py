"""`python -m trainctl.service.openapi` prints the API's OpenAPI schema (`make openapi` saves
it)."""

from __future__ import annotations

import json
from typing import Any

from trainctl.service.app import create_app
from trainctl.service.settings import Settings

OPENAPI_FILE = "openapi/openapi.json"


def build_openapi() -> dict[str, Any]:
    # Explicit settings: the schema must not depend on the environment that generates it.
    return create_app(Settings(workers=0, api_token=None)).openapi()


def render_openapi() -> str:
    return json.dumps(build_openapi(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    print(render_openapi(), end="")
