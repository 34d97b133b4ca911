"""A usable model out, end to end (issue 15's acceptance): a `tiny` model trained forty steps
on stdlib source writes samples as it trains; a sample run continues prompts with its
checkpoint; an export run writes a folder that transformers loads and that computes the same
function; and what cannot work is refused at submit with a 422, or fails saying why."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from tests.support.hf_archs import hf
from tests.support.service_process import Service, finished, submit
from tests.support.stores import posix_store
from trainctl.store.models.generation import GenerationSettings
from trainctl.store.models.presets import ModelConfig
from trainctl.worker.models.generation import generate_tokens, load_for_generation

# What these tests check is the plumbing (samples at their steps, a sample run, an export
# that computes the same function), not how good the text is: forty steps show it as well
# as three hundred did (test_train.py checks that training lowers the loss).
STEPS = 40
HALF = STEPS // 2
TINY = {"micro_batch_size": 8, "seq_len": 128}
PROMPTS = ["def ", "import "]
AS_TRAINED: dict[str, tuple[int, int]] = {}  # the experiment's files when training ended


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, dict[str, Any]]]:
    """The service, and a finished train run of `tiny` on stdlib source with samples."""
    service = Service(tmp_path_factory.mktemp("model-output")).start()
    try:
        run = submit(
            service, "train", experiment="code", steps=STEPS, checkpoint_every=HALF,
            val_every=HALF, batch=TINY, sample_every=HALF, sample_prompts=PROMPTS,
            sample_settings={"max_new_tokens": 24, "temperature": 0.0},
        )  # fmt: skip
        done = finished(service, run["id"])
        # What sample and export runs read must stay as training left it.
        AS_TRAINED.update(tree(service.data_dir / "checkpoints" / "code"))
        yield service, done
    finally:
        service.stop()


def events(service: Service, run_id: str, type: str) -> list[dict[str, Any]]:
    """The data of the run's events of `type`, read from its (finished) SSE stream."""
    text = httpx.get(f"{service.url}/runs/{run_id}/events", timeout=60).text
    frames = [
        json.loads(line[len("data: ") :])
        for line in text.splitlines()
        if line.startswith("data: {")
    ]
    return [f["data"] for f in frames if f.get("type") == type]


def tree(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder`: (size, mtime in ns); what a reader must leave alone."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_samples_are_written_as_the_model_trains(trained: tuple[Service, dict[str, Any]]) -> None:
    service, run = trained
    assert run["state"] == "succeeded", run["error"]

    samples = events(service, run["id"], "sample")

    assert [(s["step"], s["prompt"]) for s in samples] == [
        (HALF, "def "), (HALF, "import "), (STEPS, "def "), (STEPS, "import "),
    ]  # fmt: skip
    assert all(s["completion"] and s["seed"] == 0 for s in samples)
    assert {s["finish_reason"] for s in samples} == {"length"}  # bytes: no end-of-text token


def test_a_sample_run_streams_its_completions_and_returns_them(
    trained: tuple[Service, dict[str, Any]],
) -> None:
    service, _ = trained
    run = submit(
        service, "sample", checkpoint="latest", experiment="code", prompts=PROMPTS,
        generation={"max_new_tokens": 48, "temperature": 0.8, "top_k": 50, "seed": 7},
    )  # fmt: skip
    done = finished(service, run["id"])
    assert done["state"] == "succeeded", done["error"]

    result = done["result"]
    texts = [c["text"] for c in result["completions"]]
    assert [c["prompt"] for c in result["completions"]] == PROMPTS
    assert all(len(t) > 0 for t in texts) and result["checkpoint"]["step"] == STEPS
    streamed = ["", ""]
    for piece in events(service, run["id"], "sample"):
        streamed[piece["index"]] += piece["delta"]
    assert streamed == texts  # the stream is the completion, piece by piece

    same = submit(service, "sample", checkpoint=f"code/step_{STEPS}", prompts=PROMPTS,
                  generation=run["spec"]["generation"])  # fmt: skip
    again = finished(service, same["id"])
    assert [c["text"] for c in again["result"]["completions"]] == texts  # same seed, same text


def test_the_export_loads_in_transformers_and_computes_the_same_function(
    trained: tuple[Service, dict[str, Any]], tmp_path: Path
) -> None:
    transformers = pytest.importorskip("transformers")
    service, _ = trained
    checkpoint = service.data_dir / "checkpoints" / "code" / f"step_{STEPS}"

    done = finished(service, submit(service, "export", checkpoint=f"code/step_{STEPS}")["id"])
    assert done["state"] == "succeeded", done["error"]
    assert done["result"]["architecture"] == "Qwen3ForCausalLM"
    assert any("softcap" in d for d in done["result"]["differences"])
    folder = download_export(service, f"code/step_{STEPS}", tmp_path / "hf")
    # The sample and export runs before wrote nothing into a training checkpoint.
    assert tree(service.data_dir / "checkpoints" / "code") == AS_TRAINED

    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ours, codec = load_for_generation(
        posix_store(checkpoint.parent.parent), ("code", f"step_{STEPS}")
    )
    assert codec is not None
    ids = torch.tensor([codec.encode("def main():\n    return 1\n")])
    assert (
        tokenizer(tokenizer.decode(ids[0]), add_special_tokens=False).input_ids == ids[0].tolist()
    )
    assert isinstance(ours.config, ModelConfig)
    cap = ours.config.logit_softcap
    with torch.no_grad():
        theirs = cap * torch.tanh(hf(ids).logits / cap)
        mine = ours(ids)
    assert torch.allclose(theirs, mine, atol=1e-4, rtol=0), (theirs - mine).abs().max()

    greedy = GenerationSettings(max_new_tokens=64, temperature=0.0)
    (tokens,) = generate_tokens(ours, ids.tolist(), greedy)
    out = hf.generate(ids, max_new_tokens=64, do_sample=False, pad_token_id=0)
    assert out[0, ids.shape[1] :].tolist() == tokens

    again = httpx.post(f"{service.url}/runs/export", json={"checkpoint": f"code/step_{STEPS}"})
    assert again.status_code == 409 and "already exported" in again.json()["detail"]


def download_export(service: Service, name: str, folder: Path) -> Path:
    """The export `name` (experiment/tag) over HTTP into `folder`, each file checked against
    the sha256 the listing gives, as a client downloads it."""
    folder.mkdir()
    for f in httpx.get(f"{service.url}/exports/{name}", timeout=60).json()["files"]:
        body = httpx.get(f"{service.url}/exports/{name}/files/{f['name']}", timeout=60)
        assert hashlib.sha256(body.content).hexdigest() == f["sha256"]
        (folder / f["name"]).write_bytes(body.content)
    return folder


@pytest.mark.slow
def test_a_transformers_llama_trains_exports_and_samples_through_the_service(
    trained: tuple[Service, dict[str, Any]], tmp_path: Path
) -> None:
    """Issue 24 through the real service: the in-process rounds
    (tests/worker/models/test_hf_models.py) at the fewest steps that give a checkpoint, on the
    module's service so no start is paid."""
    transformers = pytest.importorskip("transformers")
    service, _ = trained
    run = submit(
        service, "train", experiment="llama", steps=4, model={"hf": hf("llama")},
        batch={"micro_batch_size": 2, "seq_len": 32}, data={"max_bytes": 100_000},
        checkpoint_every=4, val_batches=1,
    )  # fmt: skip
    done = finished(service, run["id"])
    assert done["state"] == "succeeded", done["error"]

    export = finished(service, submit(service, "export", checkpoint="llama/step_4")["id"])
    assert export["state"] == "succeeded", export["error"]
    assert export["result"]["architecture"] == "LlamaForCausalLM"
    folder = download_export(service, "llama/step_4", tmp_path / "hf")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    store = posix_store(service.data_dir / "checkpoints")
    ours, codec = load_for_generation(store, ("llama", "step_4"))
    assert codec is not None
    ids = torch.tensor([codec.encode("def main():\n    return 1\n")])
    with torch.no_grad():
        torch.testing.assert_close(theirs(input_ids=ids).logits, ours(ids), rtol=0, atol=1e-5)

    sample = submit(
        service, "sample", checkpoint="llama/step_4", prompts=["def "],
        generation={"max_new_tokens": 8, "temperature": 0.0},
    )  # fmt: skip
    sampled = finished(service, sample["id"])
    assert sampled["state"] == "succeeded", sampled["error"]
    (completion,) = sampled["result"]["completions"]
    prompt = torch.tensor([codec.encode("def ")])
    greedy = theirs.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert completion["token_ids"] == greedy[0, prompt.shape[1] :].tolist()


def test_what_cannot_work_is_refused_at_submit_naming_the_limit(
    trained: tuple[Service, dict[str, Any]],
) -> None:
    service, _ = trained
    raw = submit(
        service, "train", experiment="raw", steps=2, batch=TINY, data={"source": "synthetic"}
    )
    assert finished(service, raw["id"])["state"] == "succeeded"
    on = {"checkpoint": f"code/step_{STEPS}"}
    x = {**on, "prompts": ["x"]}
    cases = [
        ({**on, "prompts": ["x" * 600]}, "prompt of 600 tokens leaves no room in the model's "
                                         "context (max_seq_len 512)"),
        ({**on, "prompts": ["x"], "generation": {"max_new_tokens": 600}},
         "+ max_new_tokens 600 = 601 exceeds the model's context (max_seq_len 512)"),
        ({"checkpoint": "raw/step_2", "prompts": ["x"]},
         "records no tokenizer (it was trained on synthetic tokens or bare shards)"),
        ({**x, "generation": {"temperature": -0.5}}, "temperature must be >= 0"),
        ({**x, "generation": {"top_p": 0}}, "top_p: Input should be greater than 0"),
        ({**x, "generation": {"top_p": 1.5}}, "top_p: Input should be less than or equal to 1"),
        ({**x, "prompt_tokens": [[1]]}, "either prompts (text) or prompt_tokens"),
        ({"checkpoint": "raw/step_2", "prompt_tokens": [[1, 2, 900]]}, "token id 900 is not below"),
    ]  # fmt: skip
    for body, expected in cases:
        r = httpx.post(f"{service.url}/runs/sample", json=body, timeout=60)
        assert r.status_code == 422 and expected in r.json()["detail"], (body, r.text)
    r = httpx.post(
        f"{service.url}/runs/train",
        json={"steps": 4, "data": {"source": "synthetic"}, "sample_every": 2,
              "sample_prompts": ["x"]},
    )  # fmt: skip
    assert r.status_code == 422 and "come from no known tokenizer" in r.json()["detail"]

    # Token ids work where text cannot.
    ok = finished(service, submit(
        service, "sample", checkpoint="raw/step_2", prompt_tokens=[[1, 2, 3]],
        generation={"max_new_tokens": 5},
    )["id"])  # fmt: skip
    assert ok["state"] == "succeeded" and len(ok["result"]["completions"][0]["token_ids"]) == 5


def test_a_sample_run_on_a_damaged_checkpoint_fails_with_the_integrity_message(
    trained: tuple[Service, dict[str, Any]],
) -> None:
    service, _ = trained
    raw = submit(
        service, "train", experiment="broken", steps=2, batch=TINY, data={"source": "synthetic"}
    )
    assert finished(service, raw["id"])["state"] == "succeeded"
    weights = service.data_dir / "checkpoints" / "broken" / "step_2" / "model.safetensors"
    with open(weights, "r+b") as f:  # a flipped byte, past the header
        f.seek(os.path.getsize(weights) - 10)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))

    run = submit(service, "sample", checkpoint="broken/step_2", prompt_tokens=[[1, 2]])
    done = finished(service, run["id"])

    assert done["state"] == "failed"
    assert "model.safetensors" in done["error"] and "does not match the manifest" in done["error"]
