"""`trainctl sample`, `checkpoints export`, `exports` and `runs watch --samples` against the
real service (`python -m trainctl.service` with a worker process), on a model the worker
trains here: `tiny`, 40 steps on the standard library's source, taking samples as it trains.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.service.cli.invoke import trainctl
from tests.support.service_process import Service, StartService
from trainctl.service.cli.sample import Transcript
from trainctl.service.sdk.client import SamplePiece, TrainctlClient, TrainingSample

PROMPTS = ("def ", "import ")


@pytest.fixture(scope="module")
def service(start_service: StartService) -> Service:
    """The service with a worker, which trains the model sampled here."""
    return start_service(workers=1)


@pytest.fixture(scope="module")
def trained(service: Service) -> tuple[str, str, str]:
    """A train run with samples every 20 steps, submitted and watched with --samples: its id,
    and what the watch printed (stdout, stderr). It saves sampled/step_20 and step_40."""
    prompts = [arg for p in PROMPTS for arg in ("--sample-prompt", p)]
    code, out, err = trainctl(
        service, "submit", "train", "-e", "sampled", "--steps", "40", "--checkpoint-every", "20",
        "--source", "stdlib", "--micro-batch-size", "8", "--seq-len", "128",
        "--sample-every", "20", *prompts, "--set", "sample_settings.max_new_tokens=24",
        "--watch", "--samples",
    )  # fmt: skip
    assert code == 0, err
    run_id = out.split("submitted train run ")[1].split()[0]
    return run_id, out, err


def quoted(text: str) -> str:
    """As JSON writes a string: one line, whatever control characters a completion holds."""
    return json.dumps(text, ensure_ascii=False)


def sample_lines(text: str) -> list[str]:
    return [
        line.strip() for line in text.splitlines() if line.startswith("  step ") and " → " in line
    ]


@pytest.mark.slow
def test_runs_watch_samples_prints_a_train_runs_samples_as_it_takes_them(
    service: Service, trained: tuple[str, str, str]
) -> None:
    run_id, _, watched = trained
    with TrainctlClient(service.url) as api:
        taken = [s for e in api.events(run_id) if (s := TrainingSample.from_event(e))]

    code, out, replayed = trainctl(service, "runs", "watch", run_id, "--samples")
    _, _, plain = trainctl(service, "runs", "watch", run_id)

    assert [(s.step, s.prompt) for s in taken] == [(step, p) for step in (20, 40) for p in PROMPTS]
    expected = [f"step {s.step}: {quoted(s.prompt)} → {quoted(s.completion)}" for s in taken]
    assert sample_lines(watched) == expected  # live, as the run took them
    assert code == 0 and f"run {run_id} succeeded" in out
    assert sample_lines(replayed) == expected  # and replayed, in event order:
    assert "saved checkpoint sampled/step_20" in replayed.split(expected[1])[1]
    assert sample_lines(plain) == [] and "saved checkpoint sampled/step_40" in plain  # no flag


@pytest.mark.slow
def test_sample_prints_the_completions_as_they_stream_and_exits_0(
    service: Service, trained: tuple[str, str, str]
) -> None:
    args = ("sample", "sampled", "latest", *PROMPTS, "--max-new-tokens", "40", "--seed", "7")

    code, out, err = trainctl(service, *args)
    _, as_json, _ = trainctl(service, *args, "--json")  # the same seed: the same text

    result = json.loads(as_json)
    texts = [c["text"] for c in result["completions"]]
    assert code == 0, err
    assert out == f"==> 1/2 <==\ndef {texts[0]}\n\n==> 2/2 <==\nimport {texts[1]}\n"
    assert [c["prompt"] for c in result["completions"]] == list(PROMPTS)
    assert result["checkpoint"] == {"experiment": "sampled", "tag": "step_40", "step": 40}
    assert result["generated_tokens"] == 80 and result["seed"] == 7
    assert "  state: succeeded" in err
    assert re.fullmatch(
        r"run \w{32} succeeded: 2 completions \(length, length\), 80 tokens at [\d,]+ tokens/s, "
        r"checkpoint sampled/step_40 \(step 40\), seed 7",
        err.splitlines()[-1],
    )


@pytest.mark.slow
def test_sample_refuses_bad_input_with_exit_2_and_the_services_reason(
    service: Service, trained: tuple[str, str, str]
) -> None:
    cases = [
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--top-p", "1.5"], "body.generation.top_p"),
        (["--max-new-tokens", "600"], "exceeds the model's context (max_seq_len 512)"),
    ]
    for flags, reason in cases:
        code, out, err = trainctl(service, "sample", "sampled", "step_20", "def ", *flags)
        assert code == 2 and out == "", (flags, err)
        assert err.startswith("error: ") and reason in err and err.endswith("(HTTP 422)\n")
    code, _, err = trainctl(service, "sample", "sampled", "step_99", "def ")
    assert code == 2 and "checkpoint: " in err and "nothing to sample from" in err


@pytest.mark.slow
def test_an_export_downloaded_with_exports_download_is_verified_and_loads_in_transformers(
    service: Service, trained: tuple[str, str, str], tmp_path: Path
) -> None:
    code, out, err = trainctl(service, "checkpoints", "export", "sampled", "latest")
    assert code == 0, err
    assert out.startswith("exported sampled/step_40 (step 40) as hf: Qwen3ForCausalLM, float32")
    assert "differences:\n  - logit softcap:" in out
    assert "download it: trainctl exports download sampled step_40 -o DIR" in err
    assert "sampled" in trainctl(service, "exports", "list")[1]

    code, out, err = trainctl(
        service, "exports", "download", "sampled", "step_40", "-o", str(tmp_path)
    )
    assert code == 0 and "sha256 verified" in out, err
    export = json.loads(trainctl(service, "exports", "show", "sampled", "step_40", "--json")[1])
    for f in export["files"]:
        assert hashlib.sha256((tmp_path / f["name"]).read_bytes()).hexdigest() == f["sha256"]

    greedy = trainctl(service, "sample", "sampled", "step_40", "def ", "--temperature", "0",
                      "--max-new-tokens", "16", "--json")  # fmt: skip
    expected = json.loads(greedy[1])["completions"][0]["token_ids"]
    assert generate_greedily(tmp_path, "def ", 16) == expected  # the softcap keeps the argmax


def generate_greedily(folder: Path, prompt: str, tokens: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=tokens, do_sample=False)
    generated: list[int] = out[0, ids.shape[1] :].tolist()
    return generated


@pytest.mark.slow
def test_export_download_json_then_a_second_export_is_refused_and_delete_frees_it(
    service: Service, trained: tuple[str, str, str], tmp_path: Path
) -> None:
    args = ("checkpoints", "export", "sampled", "step_20", "--dtype", "bfloat16")

    code, out, err = trainctl(service, *args, "--download", str(tmp_path), "--json")
    again = trainctl(service, *args)
    deleted = trainctl(service, "exports", "delete", "sampled", "step_20", "--yes")
    gone = trainctl(service, "exports", "show", "sampled", "step_20")

    result: dict[str, Any] = json.loads(out)  # stdout holds the JSON alone
    assert code == 0 and result["dtype"] == "bfloat16", err
    assert "downloaded sampled/step_20" in err
    assert {f["name"] for f in result["files"]} < {p.name for p in tmp_path.iterdir()}
    assert again[0] == 1 and "is already exported" in again[2]
    assert deleted[:2] == (0, "deleted export sampled/step_20\n")
    assert gone[0] == 1 and gone[2].startswith("error: ")


def test_export_download_without_waiting_is_a_usage_error() -> None:
    code, _, err = trainctl(
        None, "checkpoints", "export", "e", "t", "--no-watch", "--download", "."
    )

    assert (
        code == 2
        and err == "error: --download waits for the export to finish: leave out --no-watch\n"
    )


def test_the_transcript_prints_each_completion_in_prompt_order_as_its_pieces_arrive(
    capsys: pytest.CaptureFixture[str],
) -> None:
    transcript = Transcript(["a", "b"])
    printed = []
    for index, delta, finish in [(0, "1", None), (1, "x", None), (0, "2", "eot"),
                                 (1, "y", None), (1, "", "length")]:  # fmt: skip
        transcript.add(SamplePiece(index=index, delta=delta, finish_reason=finish))
        printed.append(capsys.readouterr().out)

    assert printed == [
        "==> 1/2 <==\na1",  # the first completion as it comes
        "",  # the second's piece is held: the first is not done
        "2\n\n==> 2/2 <==\nbx",  # the first ends; the second catches up
        "y",
        "\n",
    ]
