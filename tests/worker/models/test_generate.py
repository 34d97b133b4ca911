from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.checkpoints import save_checkpoint
from tests.support.plans import train_plan
from tests.support.stores import posix_store
from trainctl.store.checkpoints.manifests import METADATA_FILE, MODEL_FILE
from trainctl.store.data.datasets import TOKENIZER_FILE
from trainctl.store.data.shards import stdlib_source_files
from trainctl.store.data.tokenizer import EOT, train_tokenizer
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.models.generation import (
    GREEDY_BELOW_TEMPERATURE,
    MAX_TEMPERATURE,
    MAX_TOP_K,
    GenerationSettings,
)
from trainctl.store.models.presets import ModelConfig, get_preset
from trainctl.worker.exceptions import CheckpointCorrupt
from trainctl.worker.models.generation import (
    TextCodec,
    TextPiece,
    generate_text,
    generate_tokens,
    load_for_generation,
    nucleus,
    sample_next,
    stream_text,
)
from trainctl.worker.models.gpt import GPT, KVCache, build_model
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import train
from trainctl.worker.training.optim import build_optimizers
from trainctl.worker.training.schedule import build_scheduler

GREEDY = GenerationSettings(temperature=0, top_k=None, max_new_tokens=32)
SAMPLED = GenerationSettings(temperature=1.0, top_k=None, max_new_tokens=32, seed=7)


def model_with(**overrides: Any) -> GPT:
    # A larger init than training's makes attention far from uniform, so a wrong mask or a
    # wrong rotary position changes the logits by much more than the tolerance.
    return build_model("tiny", seed=0, init_std=0.2, **overrides).eval()


def tokens(n: int, seed: int = 0, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 512, (batch, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A BPE trained here, by trainctl's own trainer, on a few stdlib files."""
    out = tmp_path_factory.mktemp("tok")
    return train_tokenizer(stdlib_source_files()[:4], out, 400).read_bytes()


@pytest.fixture(scope="module")
def bpe(tokenizer_json: bytes) -> TextCodec:
    return TextCodec.from_tokenizer_json(tokenizer_json, "test")


# --- the KV cache ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        {},  # the tiny preset: grouped-query attention (4 heads, 2 kv heads), QK-norm
        {"n_kv_heads": 4, "qk_norm": False},
        {"n_kv_heads": 1, "mtp_depth": 2},
    ],
    ids=["gqa-qk-norm", "mha-no-qk-norm", "mqa-mtp-heads"],
)
def test_cached_logits_equal_a_full_forward_over_the_same_prefix(
    overrides: dict[str, Any],
) -> None:
    model = model_with(**overrides)
    idx = tokens(60)
    cache = KVCache(model.config, 2, 60)
    with torch.no_grad():
        full = model(idx)
        # A prompt in one forward, a chunk of several tokens after it, then one per step.
        pieces = [
            model.forward_cached(idx[:, :11], cache),
            model.forward_cached(idx[:, 11:16], cache),
        ]
        pieces += [model.forward_cached(idx[:, t : t + 1], cache) for t in range(16, 60)]
    cached = torch.cat(pieces, dim=1)
    assert cache.pos == 60
    assert full.std() > 1.0  # logits that differ a lot between tokens: the check has teeth
    torch.testing.assert_close(cached, full, rtol=1e-5, atol=1e-5)


def test_a_chunk_after_a_cache_sees_its_past_and_not_its_future() -> None:
    model = model_with()
    idx = tokens(24)
    changed = idx.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % 512
    with torch.no_grad():
        outs = []
        for seq in (idx, changed):
            cache = KVCache(model.config, 2, 24)
            model.forward_cached(seq[:, :8], cache)
            outs.append(model.forward_cached(seq[:, 8:], cache))
    torch.testing.assert_close(outs[0][:, :12], outs[1][:, :12], rtol=0, atol=0)
    assert not torch.allclose(outs[0][:, 12:], outs[1][:, 12:])


def test_last_only_gives_the_last_positions_logits() -> None:
    model = model_with()
    idx = tokens(9)
    with torch.no_grad():
        last = model.forward_cached(idx, KVCache(model.config, 2, 9), last_only=True)
        torch.testing.assert_close(last, model(idx)[:, -1:], rtol=1e-5, atol=1e-5)


def test_the_cache_refuses_positions_beyond_max_seq_len() -> None:
    model = model_with()  # max_seq_len 512
    with pytest.raises(ValueError, match="600 positions exceeds the model's max_seq_len 512"):
        KVCache(model.config, 1, 600)
    cache = KVCache(model.config, 1, 512)
    with torch.no_grad():
        model.forward_cached(tokens(510, batch=1), cache)
        with pytest.raises(
            ValueError, match="sequence length 513 exceeds the model's max_seq_len 512"
        ):
            model.forward_cached(tokens(3, batch=1), cache)
    small = KVCache(model.config, 1, 4)
    with pytest.raises(ValueError, match="sequence length 5 exceeds the cache's 4 positions"):
        model.forward_cached(tokens(5, batch=1), small)


# --- decoding tokens ------------------------------------------------------------------------


@pytest.mark.slow
def test_greedy_decoding_with_the_cache_equals_full_recomputation() -> None:
    model = model_with()
    prompts = [[1, 2, 3], [40, 41, 42, 43, 44, 45, 46, 47, 48]]  # of different lengths
    cached = generate_tokens(model, prompts, GREEDY)
    recomputed = generate_tokens(model, prompts, GREEDY, use_cache=False)
    assert cached == recomputed
    assert [len(c) for c in cached] == [32, 32]


@pytest.mark.slow
def test_each_prompt_of_a_ragged_batch_decodes_as_it_would_alone() -> None:
    model = model_with()
    prompts = [[5, 6], [7, 8, 9, 10, 11, 12, 13], [14, 15, 16, 17]]
    together = generate_tokens(model, prompts, GREEDY)
    assert together == [generate_tokens(model, [p], GREEDY)[0] for p in prompts]


@pytest.mark.slow
def test_the_same_seed_gives_the_same_text_and_another_seed_another() -> None:
    model, codec = model_with(), TextCodec()
    first = generate_text(model, codec, ["def ", "x"], SAMPLED)
    again = generate_text(model, codec, ["def ", "x"], SAMPLED)
    other = generate_text(model, codec, ["def ", "x"], SAMPLED.model_copy(update={"seed": 8}))
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert [c.text for c in first] == [c.text for c in again]
    assert [c.token_ids for c in first] != [c.token_ids for c in other]


@pytest.mark.slow
def test_top_k_of_one_is_greedy() -> None:
    model = model_with()
    prompts = [[3, 1, 4, 1, 5]]
    top1 = SAMPLED.model_copy(update={"top_k": 1})
    assert generate_tokens(model, prompts, top1) == generate_tokens(model, prompts, GREEDY)


@pytest.mark.slow
def test_a_tiny_top_p_is_greedy() -> None:
    model = model_with()
    prompts = [[3, 1, 4, 1, 5]]
    nucleus_of_one = SAMPLED.model_copy(update={"top_p": 1e-6})
    assert generate_tokens(model, prompts, nucleus_of_one) == generate_tokens(
        model, prompts, GREEDY
    )


def test_top_k_samples_only_among_the_k_most_likely() -> None:
    logits = torch.arange(10, dtype=torch.float32).repeat(2000, 1)  # token 9 most likely
    settings = GenerationSettings(temperature=5.0, top_k=3, top_p=1.0)
    drawn = sample_next(logits, settings, torch.Generator().manual_seed(0))
    assert set(drawn.tolist()) == {7, 8, 9}


def test_the_nucleus_is_the_smallest_set_of_most_likely_tokens_reaching_top_p() -> None:
    logits = torch.tensor([[0.05, 0.5, 0.15, 0.3]]).log()

    def kept(top_p: float) -> set[int]:
        return set(torch.isfinite(nucleus(logits, top_p))[0].nonzero().flatten().tolist())

    assert kept(1e-9) == {1}
    assert kept(0.5) == {1}
    assert kept(0.7) == kept(0.79) == {1, 3}
    assert kept(0.81) == {1, 3, 2}
    assert kept(1.0) == {0, 1, 2, 3}


# --- sampling at the edges of what the schema accepts ----------------------------------------

# Temperatures the schema accepts (> 0, at most MAX_TEMPERATURE), down to the smallest double:
# 1e-45 is float32's smallest subnormal, GREEDY_BELOW_TEMPERATURE its smallest normal, 4e-38
# about where the default softcap's logits (|z| <= 15) overflow float32 when divided.
EDGE_TEMPERATURES = [5e-324, 1e-45, 1e-40, GREEDY_BELOW_TEMPERATURE, 4e-38, 1e-30, 1e-3]
# The softcap bounds the logits to (-cap, cap); 0 disables it, and then nothing bounds them.
SOFTCAPS = [15.0, 1e4, 0.0]


@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize("temperature", EDGE_TEMPERATURES)
def test_a_temperature_the_schema_accepts_however_small_samples_the_most_likely_token(
    temperature: float, softcap: float
) -> None:
    model = model_with(logit_softcap=softcap)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6]]
    settings = GenerationSettings.model_validate_json(
        f'{{"temperature": {temperature!r}, "top_k": null, "max_new_tokens": 16, "seed": 3}}'
    )

    sampled = generate_tokens(model, prompts, settings)

    # At such a temperature only exact ties with the top logit keep any probability.
    assert sampled == generate_tokens(
        model, prompts, GREEDY.model_copy(update={"max_new_tokens": 16})
    )


@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize(
    "settings",
    [
        {"temperature": MAX_TEMPERATURE, "top_k": MAX_TOP_K, "top_p": 1.0},
        {"temperature": MAX_TEMPERATURE, "top_k": None, "top_p": 5e-324},
        {"temperature": 1e-45, "top_k": 1, "top_p": 5e-324},
        {"temperature": 5e-324, "top_k": MAX_TOP_K, "top_p": 1.0},
        {"temperature": 1.0, "top_k": 2, "top_p": 0.5},
    ],
    ids=["hottest-widest", "hottest-smallest-nucleus", "coldest-top1", "smallest-double", "mid"],
)
def test_every_corner_of_the_sampling_settings_decodes_valid_tokens(
    settings: dict[str, Any], softcap: float
) -> None:
    model = model_with(logit_softcap=softcap)
    chosen = GenerationSettings(max_new_tokens=16, seed=1, **settings)

    out = generate_tokens(model, [[3, 1, 4, 1, 5], [9]], chosen)

    assert [len(c) for c in out] == [16, 16]
    assert all(0 <= t < model.config.vocab_size for c in out for t in c)


def test_the_sampler_never_gives_nan_probabilities_for_huge_logits() -> None:
    """The softcap off and a huge logit gap: z / T overflowed to inf, softmax gave NaN."""
    logits = torch.tensor([[3e38, -3e38, 0.0], [1.0, 1.0, -1.0]])
    for temperature in [1e-37, 1e-10, 1.0]:
        settings = GenerationSettings(temperature=temperature, top_k=None)

        drawn = sample_next(logits, settings, torch.Generator().manual_seed(0))

        assert drawn[0].item() == 0
        assert drawn[1].item() in (0, 1)


def test_a_train_run_samples_at_the_smallest_temperature_the_schema_accepts(
    tmp_path: Path,
) -> None:
    samples: list[dict[str, Any]] = []
    plan = train_plan(
        steps=2,
        data={"source": "stdlib", "max_bytes": 200_000},
        batch={"micro_batch_size": 2, "seq_len": 64},
        val_batches=1,
        sample_every=1,
        sample_prompts=["def ", "class "],
        sample_settings={"temperature": 1e-45, "top_p": 5e-324, "max_new_tokens": 8},
    )

    result = train(plan, posix_store(tmp_path), hooks=TrainerHooks(on_sample=samples.append))

    assert result["step"] == 2
    assert [s["step"] for s in samples] == [1, 1, 2, 2]
    assert all(s["finish_reason"] in ("eot", "stop", "length") for s in samples)


def test_generation_refuses_what_would_pass_max_seq_len_naming_the_limit() -> None:
    model = model_with()  # max_seq_len 512
    settings = GenerationSettings(max_new_tokens=20)
    with pytest.raises(
        InvalidRequest, match=r"500 tokens \+ max_new_tokens 20 = 520 .*max_seq_len 512"
    ):
        generate_text(model, TextCodec(), ["a" * 500], settings)
    with pytest.raises(InvalidRequest, match="max_seq_len 512"):
        generate_tokens(model, [[1] * 512], settings)


def test_generation_leaves_a_training_model_as_it_found_it() -> None:
    model = build_model("tiny", seed=0)  # in training mode, as the train loop's model is
    pieces = stream_text(model, TextCodec(), ["ab"], SAMPLED)
    next(pieces)
    # Between pieces the caller runs with autograd, as before: only each step is inference.
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    pieces.close()
    assert model.training


@pytest.mark.gpu
def test_on_cuda_generation_runs_under_bf16_autocast_and_repeats_with_its_seed() -> None:
    model = build_model("tiny", device="cuda", seed=0)
    first = generate_text(model, TextCodec(), ["def ", "class"], SAMPLED)
    assert first == generate_text(model, TextCodec(), ["def ", "class"], SAMPLED)
    assert all(len(c.token_ids) == SAMPLED.max_new_tokens for c in first)


# --- text -----------------------------------------------------------------------------------


class Scripted(GPT):
    """The tiny model, but its next token comes from a script (per row): tests of the text
    layer need to know what is generated. The cache still advances as the real one does."""

    def __init__(self, scripts: list[list[int]]) -> None:
        super().__init__(get_preset("tiny"))
        self.scripts = scripts
        self.prompt_len = 0

    def forward_cached(
        self, idx: torch.Tensor, cache: KVCache, *, last_only: bool = False
    ) -> torch.Tensor:
        if cache.pos == 0:
            self.prompt_len = idx.shape[1]
        cache.pos += idx.shape[1]
        logits = torch.zeros(idx.shape[0], 1, self.config.vocab_size)
        for row, script in enumerate(self.scripts):  # past its end, a script repeats its last
            logits[row, 0, script[min(cache.pos - self.prompt_len, len(script) - 1)]] = 10.0
        return logits


def test_multi_byte_characters_split_across_byte_tokens_stream_only_when_whole() -> None:
    text = "héllo wörld 世界 🙂!"
    model = Scripted([list(text.encode())])
    settings = GREEDY.model_copy(update={"max_new_tokens": len(text.encode())})
    pieces: list[TextPiece] = []
    [completion] = generate_text(model, TextCodec(), ["x"], settings, on_piece=pieces.append)
    assert completion.text == text
    assert "".join(p.text for p in pieces) == text
    assert not any("\ufffd" in p.text for p in pieces)
    assert "世" in [p.text for p in pieces]  # three tokens, one piece
    assert completion.finish_reason == "length"
    assert pieces[-1].finish_reason == "length"


def test_a_stop_string_ends_the_completion_and_is_left_out() -> None:
    model = Scripted([list(b"first line\n\nsecond\n\nthird")])
    settings = GREEDY.model_copy(update={"stop": ["\n\n", "never"]})
    pieces: list[TextPiece] = []
    [completion] = generate_text(model, TextCodec(), ["x"], settings, on_piece=pieces.append)
    assert completion.text == "first line"
    assert completion.finish_reason == "stop"
    assert completion.token_ids == list(b"first line\n\n")
    # A lone "\n" could have begun the stop string: it was never streamed.
    assert "".join(p.text for p in pieces) == "first line"


def test_text_held_back_for_a_stop_string_that_never_completes_is_sent_at_the_end() -> None:
    model = Scripted([list(b"a\nb\n")])
    settings = GREEDY.model_copy(update={"stop": ["\n\n"], "max_new_tokens": 4})
    streamed = [p.text for p in stream_text(model, TextCodec(), ["x"], settings)]
    assert "".join(streamed) == "a\nb\n"
    assert streamed[-1] == "\n"


def test_each_prompt_of_a_batch_stops_on_its_own(bpe: TextCodec) -> None:
    assert bpe.eot_id is not None
    scripts = [
        [*bpe.encode("return x"), bpe.eot_id, *bpe.encode(" and more text")],
        [*bpe.encode("a, b = b, a  # swap, STOP"), *bpe.encode(" never seen" * 4)],
        bpe.encode(" word" * 40),
    ]
    model = Scripted(scripts)
    prompts = ["a", "b", "c"]
    assert len({len(bpe.encode(p)) for p in prompts}) == 1  # the script counts from the prompt
    settings = GREEDY.model_copy(update={"stop": ["STOP"], "max_new_tokens": 20})
    done = generate_text(model, bpe, prompts, settings)
    assert [(c.text, c.finish_reason) for c in done[:2]] == [
        ("return x", "eot"),
        ("a, b = b, a  # swap, ", "stop"),
    ]
    assert bpe.eot_id not in done[0].token_ids
    assert done[2].finish_reason == "length"
    assert len(done[2].token_ids) == 20


def test_the_bpe_codec_round_trips_text_and_decodes_incrementally(bpe: TextCodec) -> None:
    text = "def naïve(x):\n    return '世界' + x  # ✓\n"
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text
    assert bpe.tokenizer is not None and bpe.kind == "bpe"
    assert bpe.eot_id == bpe.tokenizer.token_to_id(EOT) == 0
    assert bpe.vocab_size <= 400
    decoder = bpe.decoder(bpe.encode("prompt"))
    pieces = [decoder.push(t) for t in ids] + [decoder.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert "" in pieces  # a character split over tokens waited for its last one


def test_a_trained_bpe_streams_what_generate_returns(bpe: TextCodec) -> None:
    model = model_with()
    streamed: dict[int, str] = {0: "", 1: ""}
    for piece in stream_text(model, bpe, ["import os\n", "class A:"], SAMPLED):
        streamed[piece.index] += piece.text
    done = generate_text(model, bpe, ["import os\n", "class A:"], SAMPLED)
    assert [streamed[0], streamed[1]] == [c.text for c in done]
    # Only ids the tokenizer has are sampled (the model's vocabulary is larger).
    assert all(t < bpe.vocab_size for c in done for t in c.token_ids)


@pytest.mark.slow
def test_a_byte_level_codec_samples_only_bytes() -> None:
    model = model_with()
    [done] = generate_text(
        model, TextCodec(), ["x"], SAMPLED.model_copy(update={"temperature": 3.0})
    )
    assert all(t < 256 for t in done.token_ids)
    assert TextCodec().encode("é") == [0xC3, 0xA9] and TextCodec().eot_id is None


# --- checkpoints ----------------------------------------------------------------------------


def save(model: GPT, root: Path, **kw: Any) -> Path:
    optimizers = build_optimizers(model)
    sched = build_scheduler(optimizers, 10)
    return save_checkpoint(model, optimizers, sched, 3, 300, 2.0, root / "exp", **kw)


def test_a_bpe_checkpoint_loads_with_its_tokenizer_and_generates_the_same(
    tmp_path: Path, tokenizer_json: bytes, bpe: TextCodec
) -> None:
    model = build_model("tiny", seed=1, mtp_depth=1).eval()
    recorded = {"kind": "bpe", "sha256": hashlib.sha256(tokenizer_json).hexdigest(), "eot_id": 0}
    folder = save(
        model, tmp_path, extra={"tokenizer": recorded}, files={TOKENIZER_FILE: tokenizer_json}
    )
    store = posix_store(tmp_path)
    loaded, codec = load_for_generation(store, (folder.parent.name, folder.name))
    assert codec is not None and codec.kind == "bpe" and codec.eot_id == bpe.eot_id
    assert isinstance(loaded.config, ModelConfig)
    assert not loaded.training and loaded.config.mtp_depth == 1
    expected = generate_text(model, bpe, ["for i in"], SAMPLED)
    assert generate_text(loaded, codec, ["for i in"], SAMPLED) == expected
    info = store.get("exp", "step_3")
    assert load_for_generation(store, info)[1] is not None


def test_a_checkpoint_of_unknown_tokens_continues_token_ids_only(tmp_path: Path) -> None:
    model = build_model("tiny", seed=1)
    save(model, tmp_path)  # no tokenizer recorded
    loaded, codec = load_for_generation(posix_store(tmp_path), ("exp", "step_3"))
    assert codec is None
    assert len(generate_tokens(loaded, [[1, 2, 3]], GREEDY)[0]) == 32
    save(model, tmp_path / "b", extra={"tokenizer": {"kind": "bytes"}})
    assert load_for_generation(posix_store(tmp_path / "b"), ("exp", "step_3"))[1] is not None


def flip_a_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01  # same size, so only a deep check sees it
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("by", ["info", "name"])
def test_a_damaged_checkpoint_fails_with_the_integrity_error(tmp_path: Path, by: str) -> None:
    folder = save(build_model("tiny", seed=1), tmp_path, extra={"tokenizer": {"kind": "bytes"}})
    store = posix_store(tmp_path)
    info = store.get("exp", "step_3")
    flip_a_byte(folder / MODEL_FILE, -100)
    with pytest.raises(CheckpointCorrupt, match=r"model\.safetensors"):
        load_for_generation(store, info if by == "info" else ("exp", "step_3"))


def test_a_damaged_or_truncated_folder_says_so_rather_than_not_found(tmp_path: Path) -> None:
    folder = save(build_model("tiny", seed=1), tmp_path)
    flip_a_byte(folder / METADATA_FILE, 0)  # no longer JSON: the store would hide it
    with pytest.raises(CheckpointCorrupt, match=r"metadata\.json"):
        load_for_generation(posix_store(tmp_path), ("exp", "step_3"))
    other = save(build_model("tiny", seed=1), tmp_path / "b")
    (other / MODEL_FILE).write_bytes((other / MODEL_FILE).read_bytes()[:-10])
    with pytest.raises(CheckpointCorrupt, match=r"model\.safetensors"):
        load_for_generation(posix_store(tmp_path / "b"), ("exp", "step_3"))
