"""Checkpoints over HTTP: listing, latest/best, downloads (Range, ETag, tar), delete, prune,
and paths that try to leave the store."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.service.fakes import save_checkpoint
from trainctl.service.schemas import CheckpointPublic
from trainctl.store.checkpoints.manifests import MANIFEST_FILE, MODEL_FILE
from trainctl.store.checkpoints.memory import MemoryStorage
from trainctl.store.checkpoints.store import CheckpointStore
from trainctl.store.db.runs import RunStore


@pytest.fixture
def three(ckpts: CheckpointStore) -> CheckpointStore:
    """exp: step_10, step_20 (the best, copied to 'best'), step_30; other: step_5."""
    save_checkpoint(ckpts, "exp", step=10, best_loss=4.0)
    save_checkpoint(ckpts, "exp", step=20, best_loss=3.0)
    save_checkpoint(ckpts, "exp", "best", step=20, best_loss=3.0)
    save_checkpoint(ckpts, "exp", step=30, best_loss=3.0)
    save_checkpoint(ckpts, "other", step=5, best_loss=9.0)
    return ckpts


def tags(response_json: dict[str, list[dict[str, str]]]) -> list[str]:
    return [item["tag"] for item in response_json["items"]]


def test_checkpoints_are_listed_by_experiment_and_step(
    client: TestClient, three: CheckpointStore
) -> None:
    everything = client.get("/checkpoints").json()
    of_exp = client.get("/checkpoints", params={"experiment": "exp"}).json()

    # 'best' holds step 20's weights, so it sorts with step 20.
    assert tags(everything) == ["step_10", "best", "step_20", "step_30", "step_5"]
    assert everything["next_cursor"] is None
    assert tags(of_exp) == ["step_10", "best", "step_20", "step_30"]
    first = of_exp["items"][0]
    assert set(first) == {"experiment", "tag", "step", "token_count", "best_loss", "run_id",
                          "created_at", "size_bytes", "files", "tokenizer",
                          "source_tokens"}  # fmt: skip
    assert [f["name"] for f in first["files"]] == [
        "model.safetensors", "optimizer.pt", "metadata.json"
    ]  # fmt: skip
    assert first["size_bytes"] == sum(f["size"] for f in first["files"])


def test_latest_and_best_are_found_per_experiment_and_across_all(
    client: TestClient, three: CheckpointStore
) -> None:
    latest = client.get("/checkpoints/latest", params={"experiment": "exp"}).json()
    best = client.get("/checkpoints/best", params={"experiment": "exp"}).json()
    best_of_all = client.get("/checkpoints/best").json()

    assert latest["tag"] == "step_30"
    assert (best["tag"], best["step"]) == ("best", 20)
    assert (best_of_all["experiment"], best_of_all["tag"]) == ("exp", "best")


def test_missing_checkpoints_are_404_with_a_reason(client: TestClient) -> None:
    for path in ["/checkpoints/latest", "/checkpoints/best", "/checkpoints/exp/step_1",
                 "/checkpoints/exp/step_1/files/model.safetensors",
                 "/checkpoints/exp/step_1/archive"]:  # fmt: skip
        response = client.get(path)
        assert response.status_code == 404, path
        detail = response.json()["detail"]
        assert "checkpoint" in detail or "does not exist" in detail, path


def test_one_checkpoint_reads_back_with_its_files(
    client: TestClient, three: CheckpointStore
) -> None:
    response = client.get("/checkpoints/exp/step_20")

    assert response.status_code == 200
    info = three.get("exp", "step_20")
    assert response.json() == CheckpointPublic.model_validate(info).model_dump(mode="json")
    assert "path" not in response.json()  # the server's own folder stays private


# --- downloads ------------------------------------------------------------------------------


def test_a_downloaded_file_matches_its_manifest_sha256_and_etag(
    client: TestClient, three: CheckpointStore
) -> None:
    entry = next(f for f in three.get("exp", "step_20").files if f["name"] == MODEL_FILE)

    response = client.get(f"/checkpoints/exp/step_20/files/{MODEL_FILE}")

    assert response.status_code == 200
    assert hashlib.sha256(response.content).hexdigest() == entry["sha256"]
    assert response.headers["etag"] == f'"{entry["sha256"]}"'
    assert response.headers["accept-ranges"] == "bytes"


def test_a_range_request_gets_206_with_exactly_those_bytes(
    client: TestClient, ckpts: CheckpointStore
) -> None:
    weights = bytes(range(256)) * 4
    save_checkpoint(ckpts, "exp", step=1, weights=weights)

    response = client.get(
        f"/checkpoints/exp/step_1/files/{MODEL_FILE}", headers={"Range": "bytes=100-199"}
    )

    assert response.status_code == 206
    assert response.content == weights[100:200]
    assert response.headers["content-range"] == f"bytes 100-199/{len(weights)}"


def test_a_range_past_the_end_is_416(client: TestClient, ckpts: CheckpointStore) -> None:
    save_checkpoint(ckpts, "exp", step=1, weights=b"x" * 10)

    response = client.get(
        f"/checkpoints/exp/step_1/files/{MODEL_FILE}", headers={"Range": "bytes=50-60"}
    )

    assert response.status_code == 416


def test_if_none_match_with_the_current_etag_is_304(
    client: TestClient, three: CheckpointStore
) -> None:
    url = f"/checkpoints/exp/step_20/files/{MODEL_FILE}"
    etag = client.get(url).headers["etag"]

    cached = client.get(url, headers={"If-None-Match": etag})
    stale = client.get(url, headers={"If-None-Match": '"0000"'})

    assert cached.status_code == 304
    assert cached.content == b""
    assert stale.status_code == 200


def test_the_manifest_itself_can_be_downloaded(client: TestClient, three: CheckpointStore) -> None:
    response = client.get(f"/checkpoints/exp/step_20/files/{MANIFEST_FILE}")

    assert response.status_code == 200
    assert [f["name"] for f in response.json()["files"]] == [
        f["name"] for f in three.get("exp", "step_20").files
    ]


def test_the_archive_untars_to_the_same_files(
    client: TestClient, three: CheckpointStore, tmp_path: Path
) -> None:
    info = three.get("exp", "step_20")

    response = client.get("/checkpoints/exp/step_20/archive")

    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-tar"
    assert response.headers["content-disposition"] == 'attachment; filename="exp-step_20.tar"'
    assert int(response.headers["content-length"]) == len(response.content)
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r|") as tar:
        tar.extractall(tmp_path / "out", filter="data")
    names = sorted(p.name for p in (tmp_path / "out" / "step_20").iterdir())
    assert names == sorted([f["name"] for f in info.files] + [MANIFEST_FILE])
    for name in names:
        with three.entry("exp", "step_20").open(name) as stored:
            assert (tmp_path / "out/step_20" / name).read_bytes() == stored.read()


# --- delete and prune -----------------------------------------------------------------------


def test_deleting_a_checkpoint_returns_it_and_removes_it(
    client: TestClient, three: CheckpointStore
) -> None:
    response = client.delete("/checkpoints/exp/step_10")

    assert response.status_code == 200
    assert response.json()["tag"] == "step_10"
    assert client.get("/checkpoints/exp/step_10").status_code == 404


def test_a_checkpoint_a_queued_run_depends_on_cannot_be_deleted(
    client: TestClient, three: CheckpointStore
) -> None:
    client.post("/runs/validate", json={"checkpoint": "exp/step_10"})

    response = client.delete("/checkpoints/exp/step_10")

    assert response.status_code == 409
    assert "in use by a queued or running run" in response.json()["detail"]


def test_the_latest_checkpoint_of_an_experiment_in_training_cannot_be_deleted(
    client: TestClient, three: CheckpointStore, runs: RunStore
) -> None:
    run = client.post("/runs/train", json={"experiment": "exp", "steps": 50}).json()

    latest = client.delete("/checkpoints/exp/step_30")
    older = client.delete("/checkpoints/exp/step_10")

    assert latest.status_code == 409
    assert run["id"] in latest.json()["detail"]
    assert older.status_code == 200


def test_prune_keeps_the_latest_and_the_step_best_came_from(
    client: TestClient, three: CheckpointStore
) -> None:
    response = client.post("/checkpoints/prune", json={"experiment": "exp", "keep_last": 1})

    assert response.status_code == 200
    result = response.json()
    assert tags({"items": result["deleted"]}) == ["step_10"]
    assert tags({"items": result["kept"]}) == ["best", "step_20", "step_30"]
    assert result["dry_run"] is False
    listed = client.get("/checkpoints", params={"experiment": "exp"}).json()
    assert tags(listed) == ["best", "step_20", "step_30"]


def test_a_dry_run_prune_reports_but_deletes_nothing(
    client: TestClient, three: CheckpointStore
) -> None:
    response = client.post(
        "/checkpoints/prune",
        json={"experiment": "exp", "keep_last": 0, "keep_best": False, "dry_run": True},
    )

    assert sorted(tags({"items": response.json()["deleted"]})) == ["step_10", "step_20"]
    assert response.json()["dry_run"] is True
    assert len(three.list_checkpoints("exp")) == 4


def test_prune_spares_what_runs_need(client: TestClient, three: CheckpointStore) -> None:
    client.post("/runs/validate", json={"checkpoint": "exp/step_10"})

    response = client.post(
        "/checkpoints/prune", json={"experiment": "exp", "keep_last": 0, "keep_best": False}
    )

    assert tags({"items": response.json()["deleted"]}) == ["step_20"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"experiment": "exp", "keep_last": -1}, "body.keep_last"),
        ({"experiment": "exp"}, "body.keep_last: Field required"),
        ({"experiment": "../x", "keep_last": 1}, "body.experiment"),
        ({"experiment": "exp", "keep_last": 1, "force": True}, "body.force"),
        ({"experiment": "exp", "keep_last": True}, "body.keep_last: Input should be a valid"),
        ({"experiment": "exp", "keep_last": 1, "keep_best": "no"}, "body.keep_best"),
        ({"experiment": "exp", "keep_last": 1, "dry_run": 1}, "body.dry_run"),
    ],
)
def test_bad_prune_requests_are_422(client: TestClient, body: object, expected: str) -> None:
    response = client.post("/checkpoints/prune", json=body)

    assert response.status_code == 422
    assert expected in response.json()["detail"]


def test_pruning_an_unknown_experiment_is_404(client: TestClient) -> None:
    response = client.post("/checkpoints/prune", json={"experiment": "nope", "keep_last": 1})

    assert response.status_code == 404


# --- any storage -------------------------------------------------------------------------


def test_a_store_in_memory_is_listed_served_archived_and_deleted_by_the_same_routes(
    client: TestClient,
) -> None:
    # The routes know the store, never its storage: one without local files serves too
    # (whole files: a Range request gets a 200 with all of it, which HTTP allows).
    memory = CheckpointStore(MemoryStorage())
    client.app.state.checkpoints = memory  # type: ignore[attr-defined]
    save_checkpoint(memory, "exp", step=10, weights=b"w" * 100)

    assert tags(client.get("/checkpoints").json()) == ["step_10"]
    url = "/checkpoints/exp/step_10/files/model.safetensors"
    got = client.get(url)
    etag = f'"{hashlib.sha256(b"w" * 100).hexdigest()}"'
    assert (got.status_code, got.content, got.headers["etag"]) == (200, b"w" * 100, etag)
    assert got.headers["content-length"] == "100"
    assert client.get(url, headers={"If-None-Match": etag}).status_code == 304
    assert client.get(url, headers={"Range": "bytes=0-9"}).content == b"w" * 100
    archive = client.get("/checkpoints/exp/step_10/archive")
    with tarfile.open(fileobj=io.BytesIO(archive.content), mode="r|") as tar:
        names = sorted(m.name for m in tar)
    assert names == sorted(f"step_10/{n}" for n in (MODEL_FILE, "optimizer.pt",
                                                    "metadata.json", MANIFEST_FILE))  # fmt: skip
    assert client.delete("/checkpoints/exp/step_10").status_code == 200
    assert tags(client.get("/checkpoints").json()) == []


# --- hostile paths --------------------------------------------------------------------------

HOSTILE_URLS = [
    "/checkpoints/exp/step_20/files/%2e%2e%2fstep_10%2fmodel.safetensors",
    "/checkpoints/exp/step_20/files/..%2f..%2f..%2fetc%2fpasswd",
    "/checkpoints/exp/step_20/files/%2fetc%2fpasswd",
    "/checkpoints/exp/step_20/files//etc/passwd",
    "/checkpoints/exp/step_20/files/..%5c..%5cmanifest.json",
    "/checkpoints/exp/step_20/files/model.safetensors%00.txt",
    "/checkpoints/exp/step_20/files/",
    "/checkpoints/exp/step_20/files/.staging-x",
    "/checkpoints/exp/%2e%2e/files/manifest.json",
    "/checkpoints/%2e%2e/exp/files/manifest.json",
    "/checkpoints/%2e%2e/%2e%2e",
    "/checkpoints/exp/%2e%2e%2fother%2fstep_5",
    "/checkpoints/exp/..%5cother",
    "/checkpoints/exp/step_20%00",
    "/checkpoints/%2fetc/passwd",
    "/checkpoints/exp/%2e%2e%2f%2e%2e/archive",
    "/checkpoints/.staging-x/step_1",
    "/checkpoints/exp/step_20/files/~",
]


@pytest.mark.slow
@pytest.mark.parametrize("url", HOSTILE_URLS)
def test_paths_that_try_to_leave_the_store_get_a_4xx_with_a_reason(
    client: TestClient, three: CheckpointStore, url: str
) -> None:
    for method in ("GET", "DELETE"):
        response = client.request(method, url)
        assert 400 <= response.status_code < 500, (method, url, response.status_code)
        detail = response.json()["detail"]
        assert isinstance(detail, str) and len(detail) > 20, detail
    assert len(three.list_checkpoints()) == 5  # nothing was deleted


@pytest.mark.parametrize(
    ("range_header", "status", "detail"),
    [
        ("bytes=999999999-", 416, "the requested range lies outside the file"),
        ("bytes=abc", 400, "Range header"),
    ],
)
def test_a_bad_range_is_answered_in_json(
    client: TestClient, three: CheckpointStore, range_header: str, status: int, detail: str
) -> None:
    url = "/checkpoints/exp/step_20/files/model.safetensors"
    response = client.get(url, headers={"Range": range_header})

    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert detail in response.json()["detail"]


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/runs/train", "/checkpoints/prune", "/tokens", "/runs"])
def test_a_body_over_the_limit_is_413_in_json_everywhere(client: TestClient, path: str) -> None:
    big = b'{"steps": 1, "pad": "' + b"x" * (2 << 20) + b'"}'
    response = client.post(path, content=big, headers={"Content-Type": "application/json"})

    assert response.status_code == 413
    assert "larger than the 1,048,576 bytes this service accepts" in response.json()["detail"]
