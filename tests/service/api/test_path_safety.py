"""Downloads and deletes resolve through the store: every way out of it is a 4xx."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.service.fakes import save_checkpoint
from tests.support.stores import folder, posix_store
from trainctl.store.checkpoints.manifests import MODEL_FILE
from trainctl.store.checkpoints.store import CheckpointStore

# One row per trick; each is tried as a file name, a tag and an experiment. A bare ".."
# segment is resolved away by HTTP clients before it is sent; the store's own tests
# (tests/store/checkpoints/test_checkpoints.py) refuse it where it would arrive.
TRICKS = {
    "encoded dot-dot": "%2e%2e",
    "double-encoded dot-dot": "%252e%252e",
    "encoded slash": "..%2f..%2fetc%2fpasswd",
    "double-encoded slash": "..%252f..%252fetc%252fpasswd",
    "backslash": "..%5c..%5cetc%5cpasswd",
    "absolute path": "%2fetc%2fpasswd",
    "windows drive": "C:%5cWindows%5cwin.ini",
    "NUL byte": "model.safetensors%00",
    "hidden staging folder": ".staging-step_1",
    "overlong utf-8 dot": "%c0%ae%c0%ae",
}
PLACES = {
    "file name": "/checkpoints/exp/step_1/files/{x}",
    "tag": "/checkpoints/exp/{x}/files/model.safetensors",
    "experiment": "/checkpoints/{x}/step_1/files/model.safetensors",
    "archive": "/checkpoints/exp/{x}/archive",
}


@pytest.fixture
def one(ckpts: CheckpointStore) -> CheckpointStore:
    save_checkpoint(ckpts, "exp", step=1)
    return ckpts


@pytest.mark.slow
@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_every_trick_in_every_place_is_refused_with_a_reason(
    client: TestClient, one: CheckpointStore, trick: str, place: str
) -> None:
    url = PLACES[place].format(x=TRICKS[trick])
    for method in ("GET", "DELETE"):
        response = client.request(method, url)
        assert 400 <= response.status_code < 500, (method, url, response.status_code)
        assert "detail" in response.json()
    assert [c.tag for c in one.list_checkpoints()] == ["step_1"]


def test_a_symlinked_file_pointing_out_of_the_store_is_not_served(
    client: TestClient, one: CheckpointStore, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"x" * 800)  # the size the manifest expects, so only the link is wrong
    model = folder(one, "exp", "step_1") / MODEL_FILE
    model.unlink()
    os.symlink(secret, model)
    response = client.get("/checkpoints/exp/step_1/files/model.safetensors")
    assert 400 <= response.status_code < 500
    assert b"xxxx" not in response.content


def test_a_symlinked_experiment_pointing_out_of_the_store_is_not_listed_or_served(
    client: TestClient, one: CheckpointStore, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    save_checkpoint(posix_store(outside), "loot", step=1)
    os.symlink(outside / "loot", folder(one, "loot"))
    assert [c["experiment"] for c in client.get("/checkpoints").json()["items"]] == ["exp"]
    response = client.get("/checkpoints/loot/step_1/files/model.safetensors")
    assert 400 <= response.status_code < 500
    assert client.delete("/checkpoints/loot/step_1").status_code >= 400
    assert (outside / "loot" / "step_1").exists()


SECRET = b"the contents of a file outside the store"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "metadata.json"])
@pytest.mark.parametrize(
    "url",
    [
        "/checkpoints/exp/step_1/archive",
        "/checkpoints/exp/step_1/files/{name}",
        "/checkpoints/exp/step_1/files/manifest.json",
        "/checkpoints/exp/step_1",
    ],
)
def test_no_endpoint_reads_a_file_of_a_checkpoint_through_a_planted_link(
    client: TestClient, one: CheckpointStore, tmp_path: Path, name: str, url: str
) -> None:
    path = folder(one, "exp", "step_1") / name
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET[:1] * path.stat().st_size)  # the size the manifest expects
    path.unlink()
    os.symlink(secret, path)

    response = client.get(url.format(name=name))

    assert response.status_code == 404, response.content[:200]
    assert SECRET[:1] * 16 not in response.content


def test_a_manifest_that_is_a_link_is_never_read(
    client: TestClient, one: CheckpointStore, tmp_path: Path
) -> None:
    checkpoint = folder(one, "exp", "step_1")
    stolen = tmp_path / "manifest.json"
    stolen.write_bytes((checkpoint / "manifest.json").read_bytes())  # a valid one, elsewhere
    (checkpoint / "manifest.json").unlink()
    os.symlink(stolen, checkpoint / "manifest.json")

    for url in ["/checkpoints/exp/step_1/archive", "/checkpoints/exp/step_1"]:
        assert client.get(url).status_code == 404
    assert client.get("/checkpoints?experiment=exp").json()["items"] == []


def test_listing_and_prune_do_not_follow_a_linked_experiment_folder(
    client: TestClient, one: CheckpointStore, tmp_path: Path
) -> None:
    outside = posix_store(tmp_path / "outside")
    for step in (1, 2, 3):
        save_checkpoint(outside, "loot", step=step)
    os.symlink(folder(outside, "loot"), folder(one, "loot"))

    assert client.get("/checkpoints?experiment=loot").json()["items"] == []
    assert client.get("/checkpoints/latest?experiment=loot").status_code == 404
    pruned = client.post("/checkpoints/prune", json={"experiment": "loot", "keep_last": 1})
    assert pruned.status_code == 404
    assert len(outside.list_checkpoints("loot")) == 3
