"""How our routes behave beyond FastAPI's defaults.

- Every route first checks the token and its scope (401, 403), then the query, then reads
  the body: nothing a client sends but its headers is read before it is known to be
  allowed. The body is parsed and validated in a worker thread, never on the event loop,
  each number at a cost linear in its length (docs/design/access.md, "Admission and access").
- In the OpenAPI schema the docstring's first line is the summary and the handler's name
  (create_train_run) is the operation id, so generated clients read well.
- A query parameter the route does not take, or one given twice, is a 422 that names it.
  FastAPI ignores the first and keeps the last of the second, so `GET /runs?stat=running` (a
  typo for `state`) listed every run, and `?limit=5&limit=500` quietly meant 500.
- Integers are read as JSON Schema reads them: `548`, `548.0` and `5.48e2` are the same
  integer, in a body, a query string or a header. A value of another JSON type (`true`,
  `"548"` in a body) or with a fraction (`5.5`) is still a 422 naming the field: the request
  models are strict about types, and this only decides which JSON numbers are integers.
- A query or header parameter is given or left out; it cannot be null, and the schema says so.
"""

from __future__ import annotations

import email.message
import inspect
import json
import re
from collections.abc import Callable, Coroutine, Iterable
from decimal import Decimal, InvalidOperation
from typing import Any

from fastapi import HTTPException, Path
from fastapi._compat import ModelField
from fastapi.concurrency import run_in_threadpool
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from trainctl.service.deps import authorize, required_scope
from trainctl.service.errors import error_responses
from trainctl.store.names import MAX_NAME_LENGTH, NAME_PATTERN, NAME_RULE
from trainctl.store.text import text_problem

# The grammar of a JSON number (RFC 8259): what a query string or header integer may look like.
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
MAX_INTEGER_DIGITS = 20
"""An integer of more digits is read as a float: no bound of the API needs more (the widest,
an event id, is 2^63 - 1: 19 digits), and a float costs the same to read however long."""
MAX_DECIMAL_CHARS = 64
"""A number with a fraction or an exponent longer than this is a float, never a Decimal."""


def read_json_integer(text: str) -> int | float:
    """A JSON integer literal: an int up to `MAX_INTEGER_DIGITS` digits, else a float.

    Reading `9` * 4000 as an int costs time quadratic in its digits; as a float it is one
    linear pass, and its value (beyond every bound, or infinite) is refused by the field's
    own check, a 422 that names the field, which a parser callback could not name.
    """
    digits = len(text) - text.startswith("-")
    return int(text) if digits <= MAX_INTEGER_DIGITS else float(text)


def read_json_number(text: str) -> int | float:
    """A JSON number with a fraction or an exponent: an int when its value is integral.

    Python's json reads `548.0` as a float, which a StrictInt field refuses; JSON Schema calls
    it the integer 548. Decimal, not float, decides: `1.0000000000000001` is not integral.
    An integral value of more than `MAX_INTEGER_DIGITS` digits stays a float (`1.5e4299` is
    infinite), which every bound of the API refuses: building it as an int would cost 4,300
    digits of arithmetic for 8 characters of input.
    """
    if len(text) > MAX_DECIMAL_CHARS:
        return float(text)
    try:
        number = Decimal(text)
    except InvalidOperation:  # an exponent past Decimal's own limits
        return float(text)
    if number == number.to_integral_value() and number.adjusted() < MAX_INTEGER_DIGITS:
        return int(number)
    return float(text)


def parse_json(body: bytes) -> Any:
    """A JSON body, its numbers read at a cost linear in their length (`read_json_number`)."""
    return json.loads(body, parse_float=read_json_number, parse_int=read_json_integer)


def _integer_text(value: object) -> object:
    if not isinstance(value, str):
        return value
    if not _JSON_NUMBER.fullmatch(value):  # pydantic's lax mode would take "1_000" or " 7"
        raise PydanticCustomError(
            "int_parsing", "Input should be a valid integer, unable to parse string as an integer"
        )
    return read_json_number(value)  # a float left here is refused, "fractional part"


JSON_NUMBER_TEXT = BeforeValidator(_integer_text)
"""Reads an integer query or header parameter as a JSON number (see the module docstring).
It goes after the bounds, `Annotated[int, Query(ge=1), JSON_NUMBER_TEXT]`: before them,
pydantic writes the bounds into the schema as `ge`/`le`, which no JSON Schema tool reads."""


class JsonNumbersRequest(Request):
    """A request whose JSON body is read in a worker thread, numbers as `parse_json` reads them.

    Parsing a body of up to `max_body_bytes` takes milliseconds, and its validation (one
    error for each of 80,000 unknown keys) hundreds: on the event loop, either would hold up
    every other request, `/healthz` too. So `read_body` parses and validates it in a thread,
    and FastAPI, which validates again, gets only bodies already found valid.
    """

    async def json(self) -> Any:
        if not hasattr(self, "_json_numbers"):
            self._json_numbers = await run_in_threadpool(parse_json, await self.body())
        return self._json_numbers

    async def read_body(self, field: ModelField) -> None:
        """Parse and validate a JSON body for `field` off the loop; raise what FastAPI would
        answer (422 naming the fields, 400), so that an invalid body never reaches it."""
        if not _is_json(self.headers.get("content-type")) or not (body := await self.body()):
            return  # FastAPI answers these itself, cheaply: no JSON is parsed
        try:
            self._json_numbers, errors = await run_in_threadpool(_parse_and_validate, body, field)
        except json.JSONDecodeError as exc:
            raise RequestValidationError([_json_error(exc)]) from None
        except RecursionError:
            raise HTTPException(400, "the body is nested too deeply to be read") from None
        except ValueError:  # not UTF-8, UTF-16 or UTF-32 text
            raise HTTPException(400, "There was an error parsing the body") from None
        if errors:
            raise RequestValidationError(errors)


def _parse_and_validate(body: bytes, field: ModelField) -> tuple[Any, list[Any]]:
    data = parse_json(body)
    return data, field.validate(data, {}, loc=("body",))[1]


def _is_json(content_type: str | None) -> bool:
    """What FastAPI reads as JSON: `application/json` or `application/*+json`."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def _json_error(exc: json.JSONDecodeError) -> dict[str, Any]:
    """The error FastAPI reports for a body that is not JSON (see errors._describe)."""
    return {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error",
            "input": {}, "ctx": {"error": exc.msg}}  # fmt: skip


class ApiRoute(APIRoute):
    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        doc = inspect.cleandoc(endpoint.__doc__ or "")
        if kwargs.get("summary") is None and doc:
            kwargs["summary"] = doc.splitlines()[0]
        # Every route may answer 422 now (a stray query parameter), so every one says so.
        kwargs["responses"] = {**error_responses(422), **(kwargs.get("responses") or {})}
        super().__init__(path, endpoint, **kwargs)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The handler, after what every route does first, in this order: the token (401,
        403: before anything the client sent but its headers is read), the query (422), the
        body, read and validated off the event loop (413, 400, 422)."""
        handler = super().get_route_handler()
        # Called once, by APIRoute.__init__, when the dependencies are all known.
        allowed = frozenset(_query_names(self.dependant))
        headers = frozenset(_header_names(self.dependant))
        needed = required_scope(self.dependant)
        body_field = self.body_field

        async def admit(request: Request) -> Response:
            if request.scope["path"].endswith("\n"):
                # Starlette anchors route patterns with `$`, which Python's `re` also matches
                # before a final newline: `/healthz%0a` was `/healthz`, and with the `path`
                # convertor (`.*` stops at a newline) `.../files/metadata.json%0a` served
                # `metadata.json`. No name of this API ends in one: such a path names nothing.
                raise StarletteHTTPException(404)
            request = JsonNumbersRequest(request.scope, request.receive)
            if needed is not None:
                await authorize(request, needed)
            errors = [
                _query_error(request, name, allowed)
                for name in dict.fromkeys(request.query_params.keys())
                if name not in allowed or len(request.query_params.getlist(name)) > 1
            ]
            errors += _text_errors(request, headers)
            if errors:
                raise RequestValidationError(errors)
            if body_field is not None:
                await request.read_body(body_field)
            return await handler(request)

        return admit


def _query_names(dependant: Dependant) -> set[str]:
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


def _header_names(dependant: Dependant) -> set[str]:
    names = {p.alias.lower() for p in dependant.header_params}
    for sub in dependant.dependencies:
        names |= _header_names(sub)
    return names


def _text_errors(request: Request, headers: frozenset[str]) -> list[dict[str, Any]]:
    """A 422 for each path, query or header parameter that is not text a database can hold:
    a NUL (which a PostgreSQL text column refuses; no name, id or value of this API has one)
    or what UTF-8 cannot encode (store.text). Every string parameter of every route, so a
    new one cannot be forgotten."""
    given = [
        *(("path", name, value) for name, value in request.path_params.items()),
        *(("query", name, value) for name, value in request.query_params.multi_items()),
        *(("header", name, request.headers[name]) for name in headers if name in request.headers),
    ]
    errors = []
    for where, name, value in given:
        problem = "holds a NUL character" if "\x00" in value else text_problem(value)
        if problem is not None:
            msg = f"{problem}: no name, id or value of this API has one"
            errors.append({"type": "string_unicode", "loc": (where, name), "msg": msg})
    return errors


def _query_error(request: Request, name: str, allowed: frozenset[str]) -> dict[str, Any]:
    values = request.query_params.getlist(name)
    if name in allowed:
        msg = f"given {len(values)} times; give it once"
    elif allowed:
        msg = f"not a parameter of this endpoint; it takes: {', '.join(sorted(allowed))}"
    else:
        msg = "not a parameter of this endpoint; it takes no query parameters"
    return {"type": "extra_forbidden", "loc": ("query", name), "msg": msg, "input": values[-1]}


def match_whole_paths(routes: Iterable[BaseRoute]) -> None:
    """End the path pattern of each plain Starlette route (the dashboard, its files, the
    docs) at the very end of the path, `\\Z` for Starlette's `$` (see `ApiRoute`), in place.
    API routes, which FastAPI builds lazily, refuse such a path in their handler instead."""
    for route in routes:
        regex = getattr(route, "path_regex", None)
        if isinstance(regex, re.Pattern) and regex.pattern.endswith("$"):
            whole = re.compile(regex.pattern.removesuffix("$") + r"\Z", regex.flags)
            route.path_regex = whole  # type: ignore[attr-defined]


def operation_id(route: APIRoute) -> str:
    return route.name


def without_null_parameters(schema: dict[str, Any]) -> dict[str, Any]:
    """Drop `null` from the schema of every path, query and header parameter, in place.

    FastAPI writes an optional parameter (`int | None = None`) as `anyOf: [integer, null]`;
    but a query string or a header has no null, and a generator that sends the text "null"
    for one gets a 422. An optional parameter is one left out, which `required` says.
    """
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                options = parameter["schema"].get("anyOf", [])
                kept = [option for option in options if option != {"type": "null"}]
                if len(kept) < len(options):
                    del parameter["schema"]["anyOf"]
                    if len(kept) == 1:
                        parameter["schema"].update(kept[0])
                    else:
                        parameter["schema"]["anyOf"] = kept
    return schema


TEXT_PARAMETER_PATTERN = r"^[^\x00]*$"
"""What every string parameter without a pattern of its own holds: no NUL (`_text_errors`)."""


def with_text_rule(schema: dict[str, Any]) -> dict[str, Any]:
    """State `_text_errors`' rule in the schema, in place: every string path, query or header
    parameter that has no pattern of its own gets one without NUL, so a client (and the
    fuzzer) knows a value the server refuses before sending it. (What UTF-8 cannot encode
    never arrives over HTTP: percent-decoding writes U+FFFD for it.)"""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                spec = parameter["schema"]
                if spec.get("type") == "string" and "pattern" not in spec and "enum" not in spec:
                    spec["pattern"] = TEXT_PARAMETER_PATTERN
    return schema


def name_in_path(what: str) -> Any:
    """A path parameter holding a store name: the store's rule (store.names), published in
    the schema so that a client can check a name before it sends it."""
    return Path(
        pattern=NAME_PATTERN, max_length=MAX_NAME_LENGTH, description=f"{what}: {NAME_RULE}."
    )
