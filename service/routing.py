"""How our routes behave beyond FastAPI's defaults.

- In the OpenAPI schema the docstring's first line is the summary and the handler's name
  (create_train_run) is the operation id, so generated clients read well.
- A query parameter the route does not take, or one given twice, is a 422 that names it.
  FastAPI ignores the first and keeps the last of the second, so `GET /runs?stat=running` (a
  typo for `state`) listed every run, and `?limit=5&limit=500` quietly meant 500.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from trainctl.service.errors import error_responses


class ApiRoute(APIRoute):
    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        doc = inspect.cleandoc(endpoint.__doc__ or "")
        if kwargs.get("summary") is None and doc:
            kwargs["summary"] = doc.splitlines()[0]
        # Every route may answer 422 now (a stray query parameter), so every one says so.
        kwargs["responses"] = {**error_responses(422), **(kwargs.get("responses") or {})}
        super().__init__(path, endpoint, **kwargs)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        allowed = frozenset(_query_names(self.dependant))  # called once, by APIRoute.__init__

        async def strict_query(request: Request) -> Response:
            errors = [
                _query_error(request, name, allowed)
                for name in dict.fromkeys(request.query_params.keys())
                if name not in allowed or len(request.query_params.getlist(name)) > 1
            ]
            if errors:
                raise RequestValidationError(errors)
            return await handler(request)

        return strict_query


def _query_names(dependant: Dependant) -> set[str]:
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def _query_error(request: Request, name: str, allowed: frozenset[str]) -> dict[str, Any]:
    values = request.query_params.getlist(name)
    if name in allowed:
        msg = f"given {len(values)} times; give it once"
    elif allowed:
        msg = f"not a parameter of this endpoint; it takes: {', '.join(sorted(allowed))}"
    else:
        msg = "not a parameter of this endpoint; it takes no query parameters"
    return {"type": "extra_forbidden", "loc": ("query", name), "msg": msg, "input": values[-1]}


def operation_id(route: APIRoute) -> str:
    return route.name
