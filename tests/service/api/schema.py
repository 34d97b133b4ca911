"""Cases generated from the app's own OpenAPI schema, so that a field or a parameter added
later is covered without anyone listing it: every string a body can hold, every parameter,
every pattern."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI

METHODS = ("get", "put", "post", "delete", "patch")
KEY = object()
"""In a slot's path: the string is a key of the object there (a `dict[str, ...]`)."""
Slot = tuple[Any, ...]


def operations(app: FastAPI) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(method, path, operation) for every operation the app publishes."""
    for path, item in app.openapi()["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield method, path, operation


def body_schema(app: FastAPI, operation: dict[str, Any]) -> dict[str, Any] | None:
    content = operation.get("requestBody", {}).get("content", {})
    schema = content.get("application/json", {}).get("schema")
    return None if schema is None else resolve(app.openapi(), schema)


def resolve(root: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with its `$ref` followed and a nullable `anyOf` reduced to its one non-null
    option (the form of every optional field)."""
    while True:
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            schema = {
                **root["components"]["schemas"][name],
                **{k: v for k, v in schema.items() if k != "$ref"},
            }
            continue
        options = [o for o in schema.get("anyOf", []) if o.get("type") != "null"]
        if len(options) == 1:
            schema = {**{k: v for k, v in schema.items() if k != "anyOf"}, **options[0]}
            continue
        return schema


def string_slots(root: dict[str, Any], schema: dict[str, Any], path: Slot = ()) -> Iterator[Slot]:
    """Every place a string can sit in a value of `schema`: a string field, a list's item,
    an object's key and its values where any value is allowed (`dict[str, Any]`)."""
    schema = resolve(root, schema)
    if schema.get("type") == "string" or ("enum" in schema and "type" not in schema):
        yield path
    elif schema.get("type") == "array":
        yield from string_slots(root, schema.get("items", {}), (*path, 0))
    elif schema.get("type") == "object" or "properties" in schema:
        for name, prop in schema.get("properties", {}).items():
            yield from string_slots(root, prop, (*path, name))
        extra = schema.get("additionalProperties", False)
        if extra is not False:
            yield (*path, KEY)
            yield from string_slots(root, {} if extra is True else extra, (*path, "x"))
    elif not schema.get("type") and not schema.get("anyOf"):
        yield path  # any value at all: a string among them


def with_string(body: dict[str, Any], slot: Slot, text: str) -> dict[str, Any]:
    """A copy of `body` with `text` at `slot`, making the objects and lists on the way."""
    out = copy.deepcopy(body)
    here: Any = out
    for i, step in enumerate(slot):
        last = i == len(slot) - 1
        if step is KEY:
            assert last and isinstance(here, dict)
            here[text] = 1
            return out
        following = None if last else slot[i + 1]
        fresh: Any = text if last else ([None] if following == 0 else {})
        if isinstance(here, list):
            here[0] = fresh if last or not isinstance(here[0], list | dict) else here[0]
            here = here[0]
        else:
            if last or not isinstance(here.get(step), list | dict):
                here[step] = fresh
            here = here[step]
    return out


def patterns(schema: Any) -> Iterator[str]:
    """Every `pattern` anywhere in a schema."""
    if isinstance(schema, dict):
        if isinstance(schema.get("pattern"), str):
            yield schema["pattern"]
        for value in schema.values():
            yield from patterns(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from patterns(value)
