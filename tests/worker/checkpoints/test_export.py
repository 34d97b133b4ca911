"""Export to Hugging Face transformers, checked against real transformers (nothing downloaded):
a `tiny` model trained a few steps on stdlib source, saved by the real checkpoint writer,
exported, loaded with AutoModelForCausalLM / AutoTokenizer, and compared with trainctl."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from safetensors import safe_open

from tests.support.checkpoints import save_checkpoint, trained_model
from tests.support.stores import entry_at, posix_store
from trainctl.store.checkpoints.exports import FIELD_RULES, ExportResult
from trainctl.store.checkpoints.manifests import (
    MANIFEST_FILE,
    METADATA_FILE,
    MODEL_FILE,
    verify_manifest,
)
from trainctl.store.data.datasets import TOKENIZER_FILE
from trainctl.store.data.shards import stdlib_source_files
from trainctl.store.data.tokenizer import EOT, train_tokenizer
from trainctl.store.evals.tasks import EvalResult
from trainctl.store.exceptions import CheckpointCorrupt, Conflict, InvalidRequest
from trainctl.store.models.generation import GenerationSettings
from trainctl.store.models.presets import ModelConfig
from trainctl.worker.checkpoints import exports as export
from trainctl.worker.checkpoints.exports import export_hf, hf_name
from trainctl.worker.models.generation import generate_tokens
from trainctl.worker.models.gpt import GPT
from trainctl.worker.training.optim import build_optimizers
from trainctl.worker.training.schedule import build_scheduler

transformers = pytest.importorskip("transformers", reason="the dev extra installs transformers")

NEW_TOKENS = 64
TOLERANCE = 1e-4
BYTES = {"tokenizer": {"kind": "bytes", "sha256": None, "eot_id": None}, "dataset": None}


def stdlib_text(max_bytes: int = 60_000) -> str:
    parts, total = [], 0
    for path in stdlib_source_files():
        parts.append(path.read_text(encoding="utf-8", errors="replace"))
        total += len(parts[-1])
        if total >= max_bytes:
            break
    return "".join(parts)


def save(model: torch.nn.Module, root: Path, **kw: Any) -> Path:
    optimizers = build_optimizers(model)
    scheduler = build_scheduler(optimizers, 100)
    return save_checkpoint(model, optimizers, scheduler, 8, 2080, 2.25, root / "exp", **kw)


def export_to(checkpoint: Path, exports: Path, **kw: Any) -> ExportResult:
    """Export the checkpoint folder into the exports store at `exports`, under the
    checkpoint's own name, as an export run does."""
    store = posix_store(exports)
    return export_hf(entry_at(checkpoint), store, checkpoint.parent.name, checkpoint.name, **kw)


def softcapped(logits: torch.Tensor, cap: float) -> torch.Tensor:
    return cap * torch.tanh(logits / cap) if cap > 0 else logits


def max_logit_diff(model: GPT, hf: Any, tokens: torch.Tensor) -> float:
    with torch.no_grad():
        ours = model(tokens)
        theirs = softcapped(hf(tokens).logits, model.config.logit_softcap)
    return float((ours - theirs).abs().max())


def greedy(model: GPT, prompt: list[int], n: int) -> list[int]:
    """trainctl's greedy decoding (worker.models.generation, KV cache), with no stop token."""
    settings = GenerationSettings(max_new_tokens=n, temperature=0.0)
    return generate_tokens(model, [prompt], settings, eot_id=None)[0]


def hf_greedy(hf: Any, prompt: list[int], n: int) -> list[int]:
    """transformers' own generate (KV cache), with no stop token: exactly `n` new tokens."""
    config = transformers.GenerationConfig(
        max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    ids = torch.tensor([prompt])
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return list(out[0, len(prompt) :].tolist())


def load_hf(folder: Path, **kw: Any) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(folder, **kw).eval()


@pytest.fixture(scope="module")
def byte_trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[GPT, Path]:
    """A byte-level model and its checkpoint, trained once for the module's tests."""
    model = trained_model(list(stdlib_text().encode()))
    return model, save(model, tmp_path_factory.mktemp("bytes"), extra=BYTES)


@pytest.fixture
def checkpoint(byte_trained: tuple[GPT, Path], tmp_path: Path) -> Path:
    """This test's own copy of the byte-level checkpoint (it may damage it)."""
    _, source = byte_trained
    return Path(shutil.copytree(source, tmp_path / "store" / "exp" / source.name))


# --- a BPE checkpoint with GQA and MTP heads: the main path ---------------------------------


@pytest.fixture(scope="module")
def bpe_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[GPT, Path, ExportResult]:
    root = tmp_path_factory.mktemp("bpe")
    tokenizer_file = train_tokenizer(stdlib_source_files()[:3], root / "tokenizer", 512)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    model = trained_model(tokenizer.encode(stdlib_text()).ids, mtp_depth=2)
    assert model.config.n_kv_heads < model.config.n_heads  # the tiny preset is GQA
    data = tokenizer_file.read_bytes()
    eot_id = tokenizer.token_to_id(EOT)
    recorded = {"kind": "bpe", "sha256": hashlib.sha256(data).hexdigest(), "eot_id": eot_id}
    dataset = {"folder": "/data/datasets/stdlib", "tokenizer": recorded, "bytes_per_token": 3.0}
    checkpoint = save(
        model,
        root / "store",
        extra={"tokenizer": recorded, "dataset": dataset},
        files={TOKENIZER_FILE: data},
    )
    # Where the service keeps exports: a checkpoint store of their own (store.checkpoints.exports).
    return model, checkpoint, export_to(checkpoint, root / "exports", dtype="float32")


@pytest.mark.slow
def test_the_export_loads_in_transformers_without_remote_code(
    bpe_export: tuple[GPT, Path, ExportResult],
) -> None:
    _, _, result = bpe_export
    hf = load_hf(Path(result.folder))
    assert type(hf).__name__ == result.architecture == "Qwen3ForCausalLM"
    assert hf.dtype == torch.float32
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()  # tied
    with safe_open(str(Path(result.folder) / MODEL_FILE), framework="pt") as st:
        names = set(st.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert not any("mtp" in n for n in names)


@pytest.mark.slow
def test_softcapped_logits_equal_trainctl_s_in_float32(
    bpe_export: tuple[GPT, Path, ExportResult],
) -> None:
    model, _, result = bpe_export
    tokens = torch.randint(
        0, model.config.vocab_size, (2, 200), generator=torch.Generator().manual_seed(1)
    )
    assert max_logit_diff(model, load_hf(Path(result.folder)), tokens) <= TOLERANCE


@pytest.mark.slow
def test_greedy_generation_of_64_tokens_is_identical(
    bpe_export: tuple[GPT, Path, ExportResult],
) -> None:
    model, _, result = bpe_export
    tokenizer = transformers.AutoTokenizer.from_pretrained(Path(result.folder))
    prompt = tokenizer("def main(argv):\n    ")["input_ids"]
    ours = greedy(model, prompt, NEW_TOKENS)
    assert hf_greedy(load_hf(Path(result.folder)), prompt, NEW_TOKENS) == ours
    assert len(set(ours)) > 1  # a model stuck on one token would prove little


@pytest.mark.slow
def test_the_bpe_tokenizer_loads_offline_and_round_trips_text(
    bpe_export: tuple[GPT, Path, ExportResult],
) -> None:
    _, checkpoint, result = bpe_export
    tokenizer = transformers.AutoTokenizer.from_pretrained(Path(result.folder))
    assert type(tokenizer).__name__ == "PreTrainedTokenizerFast" and result.tokenizer == "bpe"
    text = "import os\n\ndef héllo(wörld: str) -> None:\n    print('ünïcode ✓', 42)\n"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.eos_token == EOT and tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids(
        EOT
    )
    assert (Path(result.folder) / TOKENIZER_FILE).read_bytes() == (
        checkpoint / TOKENIZER_FILE
    ).read_bytes()
    config = json.loads((Path(result.folder) / "generation_config.json").read_text())
    assert config["eos_token_id"] == tokenizer.eos_token_id


@pytest.mark.slow
def test_generate_takes_the_tokenizer_s_output_as_it_is(
    bpe_export: tuple[GPT, Path, ExportResult],
) -> None:
    _, _, result = bpe_export
    tokenizer = transformers.AutoTokenizer.from_pretrained(Path(result.folder))
    model = transformers.AutoModelForCausalLM.from_pretrained(Path(result.folder))

    inputs = tokenizer("import os\n", return_tensors="pt")  # what every model card shows
    out = model.generate(**inputs, max_new_tokens=4, do_sample=False)

    assert set(inputs) == {"input_ids", "attention_mask"} and out.shape[1] > 0


@pytest.mark.slow
def test_differences_name_the_softcap_and_the_dropped_mtp_heads(
    bpe_export: tuple[GPT, Path, ExportResult],
) -> None:
    _, _, result = bpe_export
    softcap, mtp = result.differences
    assert "transformers computes z; trainctl computes cap*tanh(z/cap) with cap=15" in softcap
    assert "greedy decoding is unchanged" in softcap and "sampling probabilities differ" in softcap
    assert mtp.startswith("multi-token-prediction heads dropped: 2")
    card = (Path(result.folder) / "README.md").read_text()
    assert all(d in card for d in result.differences)


@pytest.mark.slow
def test_the_model_card_gives_the_training_facts(
    bpe_export: tuple[GPT, Path, ExportResult],
) -> None:
    _, _, result = bpe_export
    card = (Path(result.folder) / "README.md").read_text()
    for row in (
        "| checkpoint | exp/step_8 |",
        "| steps | 8 |",
        "| tokens | 2,080 |",
        "| data | prepared dataset `/data/datasets/stdlib` |",
        "| best validation loss | 2.2500 nats/token |",
        "| best validation bits per byte | 1.0820 |",  # 2.25 / ln 2 / 3.0
        "| trained by | trainctl ",
    ):
        assert row in card


@pytest.mark.slow
def test_the_card_of_a_checkpoint_never_evaluated_says_none_were_run(
    bpe_export: tuple[GPT, Path, ExportResult],
) -> None:
    _, _, result = bpe_export
    card = (Path(result.folder) / "README.md").read_text()
    evaluations = card.split("## Evaluations")[1].split("##")[0]
    assert evaluations.strip().startswith("None were run") and "| task |" not in evaluations


@pytest.mark.slow
def test_the_card_lists_each_eval_result_of_the_checkpoint_with_how_it_was_scored(
    checkpoint: Path, tmp_path: Path
) -> None:
    evals = [
        EvalResult("arc_easy", "acc", 0.3125, 1, 16, "run-a"),
        EvalResult("arc_easy", "acc_norm", 0.375, 1, 16, "run-a"),
        EvalResult("mmlu_anatomy", "bits_per_byte", 2.5, 0, None, "run-b"),
    ]

    result = export_to(checkpoint, tmp_path / "exports", evals=evals)

    card = (Path(result.folder) / "README.md").read_text()
    assert "| task | metric | value | few-shot | limit | evaluate run |" in card
    for row in (
        "| arc_easy | acc | 0.3125 | 1 | 16 | run-a |",
        "| arc_easy | acc_norm | 0.3750 | 1 | 16 | run-a |",
        "| mmlu_anatomy | bits_per_byte | 2.5000 | 0 | all | run-b |",
    ):
        assert row in card
    assert "None were run" not in card


@pytest.mark.slow
def test_the_manifest_lists_and_verifies_every_file(
    bpe_export: tuple[GPT, Path, ExportResult],
) -> None:
    _, _, result = bpe_export
    manifest = verify_manifest(entry_at(Path(result.folder)), deep=True)
    listed = {f["name"] for f in manifest["files"]}
    assert listed == {p.name for p in Path(result.folder).iterdir()} - {MANIFEST_FILE}
    assert listed >= {MODEL_FILE, "config.json", "generation_config.json", TOKENIZER_FILE,
                      "tokenizer_config.json", "README.md", METADATA_FILE}  # fmt: skip
    assert manifest["files"] == result.files


@pytest.mark.slow
def test_an_exports_store_lists_and_serves_the_export_as_a_checkpoint(
    bpe_export: tuple[GPT, Path, ExportResult],
) -> None:
    model, _, result = bpe_export
    exports = posix_store(Path(result.folder).parent.parent)
    info = exports.get("exp", "step_8")
    assert (info.step, info.token_count, info.best_loss) == (8, 2080, 2.25)
    assert info.model_config == model.config and info.tokenizer is not None
    assert [f["name"] for f in info.files] == [f["name"] for f in result.files]
    _, reader = exports.open_file("exp", "step_8", "config.json")
    with reader:
        assert json.loads(reader.read())["architectures"] == ["Qwen3ForCausalLM"]
    meta = json.loads((Path(result.folder) / METADATA_FILE).read_text())
    assert meta["export"]["differences"] == result.differences and "rng" not in meta


@pytest.mark.slow
def test_the_result_is_plain_json(bpe_export: tuple[GPT, Path, ExportResult]) -> None:
    _, _, result = bpe_export
    data = json.loads(json.dumps(result.to_dict()))
    assert data["folder"] == result.folder and data["format"] == "hf"
    assert data["dtype"] == "float32" and data["tokenizer"] == "bpe"


@pytest.mark.slow
def test_export_leaves_the_checkpoint_folder_untouched(
    bpe_export: tuple[GPT, Path, ExportResult],
) -> None:
    _, checkpoint, result = bpe_export
    assert sorted(p.name for p in checkpoint.iterdir()) == sorted(
        [MODEL_FILE, "optimizer.pt", "metadata.json", TOKENIZER_FILE, MANIFEST_FILE]
    )
    verify_manifest(entry_at(checkpoint), deep=True)
    assert Path(result.folder).parent != checkpoint.parent


# --- other checkpoints ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_bf16_export_loads_as_bf16_and_says_its_weights_were_rounded(
    byte_trained: tuple[GPT, Path], tmp_path: Path
) -> None:
    model, checkpoint = byte_trained
    result = export_to(checkpoint, tmp_path / "exports", dtype="bfloat16")
    hf = load_hf(Path(result.folder), dtype="auto")
    assert hf.dtype == torch.bfloat16
    assert (
        json.loads((Path(result.folder) / "config.json").read_text())["torch_dtype"] == "bfloat16"
    )
    assert any(d.startswith("weights rounded from float32 to bfloat16") for d in result.differences)
    tokens = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(2))
    assert max_logit_diff(model, hf.float(), tokens) < 0.05  # the same model, rounded (0.01)


@pytest.mark.slow
def test_a_byte_level_checkpoint_exports_a_byte_tokenizer_that_round_trips(
    byte_trained: tuple[GPT, Path], tmp_path: Path
) -> None:
    model, checkpoint = byte_trained
    result = export_to(checkpoint, tmp_path / "exports", dtype="float32")
    tokenizer = transformers.AutoTokenizer.from_pretrained(Path(result.folder))
    assert result.tokenizer == "bytes" and tokenizer.eos_token is None
    assert tokenizer.bos_token_id == 256 and tokenizer("ab")["input_ids"] == [97, 98]
    for text in ("plain ascii\n\ttabs", "héllo wörld ✓ 日本語", "".join(map(chr, range(1, 128)))):
        ids = tokenizer(text)["input_ids"]
        assert ids == list(text.encode())
        assert tokenizer.decode(ids) == text
    assert tokenizer.convert_ids_to_tokens(list(range(256))) == [
        export.byte_to_unicode()[b] for b in range(256)
    ]
    prompt = list(b"def main():\n    ")
    assert hf_greedy(load_hf(Path(result.folder)), prompt, NEW_TOKENS) == greedy(
        model, prompt, NEW_TOKENS
    )


@pytest.mark.parametrize(
    ("vocab_size", "first_note", "bos"),
    [
        (256, "byte-level tokenizer: ids 0..255 are the bytes.", None),
        (257, "byte-level tokenizer: ids 0..255 are the bytes.", 256),
        (258, "byte-level tokenizer: ids 0..255 are the bytes; id 257 of the model has no token "
         "(byte-level data never holds them).", 256),
        (512, "byte-level tokenizer: ids 0..255 are the bytes; ids 257..511 of the model have no "
         "token (byte-level data never holds them).", 256),
    ],
)  # fmt: skip
def test_byte_level_notes_name_no_empty_range_and_a_bos_where_the_model_has_an_id(
    vocab_size: int, first_note: str, bos: int | None
) -> None:
    config = dataclasses.replace(ModelConfig(), vocab_size=vocab_size)
    exported = export.export_tokenizer(cast(Any, None), BYTES, config)
    assert exported.notes[0] == first_note
    assert not any(re.search(r"(\d+)\.\.(\d+)", n) and _empty(n) for n in exported.notes)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(exported.files[TOKENIZER_FILE].decode())
    settings = json.loads(exported.files["tokenizer_config.json"])
    assert tokenizer.get_vocab_size() == 256 + (bos is not None) <= vocab_size
    if bos is None:
        assert "bos_token" not in settings
        assert any("prefix_token_id" in n for n in exported.notes)
    else:
        assert tokenizer.token_to_id(settings["bos_token"]) == bos
        assert tokenizer.encode("plain text").ids == list(b"plain text")  # nothing added


class TokenizerOnly:
    """A checkpoint's files as `export_tokenizer` reads them: its tokenizer.json alone."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def open(self, name: str) -> Any:
        assert name == TOKENIZER_FILE
        return io.BytesIO(self.data)

    def describe(self, name: str | None = None) -> str:
        return "exp/step_1"


def test_a_bpe_tokenizer_with_no_end_of_text_says_what_the_harness_then_needs() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate("abc ")}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    data = tokenizer.to_str().encode()
    recorded = {"kind": "bpe", "sha256": hashlib.sha256(data).hexdigest(), "eot_id": None}
    config = dataclasses.replace(ModelConfig(), vocab_size=512)

    exported = export.export_tokenizer(cast(Any, TokenizerOnly(data)), {"tokenizer": recorded},
                                       config)  # fmt: skip

    assert exported.eos_id is None
    settings = json.loads(exported.files["tokenizer_config.json"])
    assert "eos_token" not in settings and "bos_token" not in settings
    assert any("prefix_token_id" in n for n in exported.notes)


def _empty(note: str) -> bool:
    """Whether the note names a range `a..b` with b < a."""
    return any(int(b) < int(a) for a, b in re.findall(r"(\d+)\.\.(\d+)", note))


@pytest.mark.slow
def test_lm_evaluation_harness_scores_an_empty_context_on_a_byte_level_export(
    byte_trained: tuple[GPT, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HFLM feeds BOS (else EOS) as the context of a request with none (a rolling
    perplexity's first window, a continuation scored alone): the export must give it one."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    _, checkpoint = byte_trained
    result = export_to(checkpoint, tmp_path / "exports", dtype="float32")
    lm = HFLM(pretrained=result.folder, device="cpu", batch_size=1, dtype="float32")
    request = Instance("loglikelihood", {}, ("", "def main():"), 0)
    [(loglikelihood, _)] = lm.loglikelihood([request])
    ids = torch.tensor([[256, *b"def main():"]])
    with torch.no_grad():  # the export's own logits: transformers has no softcap
        logits = load_hf(Path(result.folder))(ids[:, :-1]).logits
    expected = torch.log_softmax(logits.float(), -1)[0].gather(1, ids[0, 1:, None]).sum()
    assert loglikelihood == pytest.approx(float(expected), abs=1e-3)


@pytest.mark.slow
def test_a_checkpoint_without_a_tokenizer_exports_weights_and_says_so(
    byte_trained: tuple[GPT, Path], tmp_path: Path
) -> None:
    model, _ = byte_trained
    checkpoint = save(model, tmp_path)  # no tokenizer recorded: synthetic tokens
    result = export_to(checkpoint, tmp_path / "exports", dtype="float32")
    assert result.tokenizer is None
    assert any(n.startswith("no tokenizer exported") for n in result.notes)
    assert not (Path(result.folder) / TOKENIZER_FILE).exists()
    assert "no tokenizer exported" in (Path(result.folder) / "README.md").read_text()
    tokens = torch.randint(0, 512, (1, 32), generator=torch.Generator().manual_seed(3))
    assert max_logit_diff(model, load_hf(Path(result.folder)), tokens) <= TOLERANCE


@pytest.mark.slow
def test_a_model_without_qk_norm_or_softcap_exports_as_llama_computing_the_same(
    tmp_path: Path,
) -> None:
    # Qwen3 always normalises q and k (a weight of ones still divides by the RMS), so a
    # model without QK-norm is Llama's function, not Qwen3's.
    model = trained_model(list(stdlib_text().encode()), qk_norm=False, logit_softcap=0.0)
    checkpoint = save(model, tmp_path, extra=BYTES)
    result = export_to(checkpoint, tmp_path / "exports", dtype="float32")
    hf = load_hf(Path(result.folder))
    assert type(hf).__name__ == result.architecture == "LlamaForCausalLM"
    assert result.differences == []
    assert "none: transformers computes the same" in (Path(result.folder) / "README.md").read_text()
    tokens = torch.randint(0, 512, (2, 100), generator=torch.Generator().manual_seed(4))
    assert max_logit_diff(model, hf, tokens) <= TOLERANCE


@pytest.mark.slow
def test_weights_saved_from_a_torch_compile_wrapper_export_without_the_prefix(
    byte_trained: tuple[GPT, Path], tmp_path: Path
) -> None:
    model, _ = byte_trained
    compiled = cast(torch.nn.Module, torch.compile(model))
    checkpoint = save(compiled, tmp_path, extra=BYTES)  # nothing runs: no compile
    with safe_open(str(checkpoint / MODEL_FILE), framework="pt") as st:
        names = list(st.keys())
    assert all(name.startswith(export.COMPILE_PREFIX) for name in names)
    result = export_to(checkpoint, tmp_path / "exports", dtype="float32")
    tokens = torch.randint(0, 256, (1, 50), generator=torch.Generator().manual_seed(5))
    assert max_logit_diff(model, load_hf(Path(result.folder)), tokens) <= TOLERANCE


# --- failures -------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_damaged_checkpoint_fails_with_the_integrity_message_and_leaves_no_folder(
    checkpoint: Path, tmp_path: Path
) -> None:
    data = bytearray((checkpoint / MODEL_FILE).read_bytes())
    data[-100] ^= 0xFF  # a weight's byte, not the header
    (checkpoint / MODEL_FILE).write_bytes(bytes(data))
    exports = tmp_path / "exports"
    with pytest.raises(CheckpointCorrupt, match=r"model\.safetensors: sha256 does not match"):
        export_to(checkpoint, exports, dtype="float32")
    assert not (exports / "exp").exists() or os.listdir(exports / "exp") == []


@pytest.mark.slow
def test_a_failure_while_writing_leaves_nothing_that_looks_complete(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "write_safetensors", full_disk)
    exports = tmp_path / "exports"
    with pytest.raises(OSError, match="No space left"):
        export_to(checkpoint, exports, dtype="float32")
    assert os.listdir(exports / "exp") == []  # neither the export nor its stage


@pytest.mark.slow
def test_export_refuses_an_export_that_exists(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "exports" / "exp" / checkpoint.name).mkdir(parents=True)
    with pytest.raises(Conflict, match="exists"):
        export_to(checkpoint, tmp_path / "exports", dtype="float32")


@pytest.mark.slow
def test_export_never_writes_over_the_checkpoint(checkpoint: Path) -> None:
    # Into the checkpoint's own store, the export's name is the checkpoint's: it exists.
    before = sorted(p.name for p in checkpoint.iterdir())
    with pytest.raises(Conflict, match="exists"):
        export_to(checkpoint, checkpoint.parent.parent, dtype="float32")
    assert sorted(p.name for p in checkpoint.parent.iterdir()) == [checkpoint.name]
    assert sorted(p.name for p in checkpoint.iterdir()) == before


def test_export_refuses_an_unknown_dtype(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="float32, bfloat16"):
        export_to(tmp_path / "store" / "exp" / "ckpt", tmp_path / "exports", dtype="float16")


def test_a_weight_with_no_transformers_counterpart_is_refused() -> None:
    assert hf_name("blocks.3.attn.wq.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("mtp_heads.0.proj.weight") is None
    with pytest.raises(InvalidRequest, match=r"'blocks\.0\.attn\.wq\.bias'"):
        hf_name("blocks.0.attn.wq.bias")


def test_every_model_config_field_has_an_export_rule() -> None:
    # A field added to ModelConfig must say how it maps, or export refuses such models.
    assert set(FIELD_RULES) == {f.name for f in dataclasses.fields(ModelConfig)}
