"""A query parameter a route does not take, or one given twice, is a 422 that names it."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # A typo must not quietly list every run.
        (
            "/runs?stat=running",
            "query.stat: not a parameter of this endpoint; it takes: cursor, experiment, kind, "
            "limit, state",
        ),
        ("/runs?limit=5&limit=500", "query.limit: given 2 times; give it once"),
        ("/checkpoints/latest?experiment=a&exp=b", "query.exp: not a parameter"),
        ("/healthz?verbose=1", "query.verbose: not a parameter of this endpoint; it takes no"),
        ("/runs/r1/events?after=1&since=2", "query.since: not a parameter"),
    ],
)
def test_a_stray_or_repeated_query_parameter_is_422_naming_it(
    client: TestClient, url: str, expected: str
) -> None:
    response = client.get(url)

    assert response.status_code == 422
    assert expected in response.json()["detail"]


def test_declared_query_parameters_still_work(client: TestClient) -> None:
    assert client.get("/runs?state=running&limit=5").status_code == 200
    assert client.get("/checkpoints/latest?experiment=nope").status_code == 404
