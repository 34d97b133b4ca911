"""How routes appear in the OpenAPI schema: the docstring's first line is the summary and
the handler's name (create_train_run) is the operation id, so generated clients read well."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from fastapi.routing import APIRoute


class SummaryRoute(APIRoute):
    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        doc = inspect.cleandoc(endpoint.__doc__ or "")
        if kwargs.get("summary") is None and doc:
            kwargs["summary"] = doc.splitlines()[0]
        super().__init__(path, endpoint, **kwargs)


def operation_id(route: APIRoute) -> str:
    return route.name
