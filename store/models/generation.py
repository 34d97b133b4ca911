"""Generation settings: what a sample run or a training sample asks of the decoder, with bounds
(docs/design/models.md, "Model output: samples, sample runs, exports", "Generation settings").

No torch here: the API validates a request's settings with `GenerationSettings` and checks a
prompt against the model's context with `check_context` at submit; `worker.models.generation`
decodes.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, StrictFloat, StrictInt, field_validator

from trainctl.store.exceptions import InvalidRequest
from trainctl.store.text import TextChecked

# The longest context a model of this service can have (store.models.presets.BOUNDS's max_seq_len).
MAX_NEW_TOKENS = 131_072
MAX_TEMPERATURE = 100.0
# float32's smallest normal number. The sampler divides the logits, shifted so that the
# largest is 0, by the temperature in float32; a temperature below this is 0 or a subnormal
# there, and every token but the most likely has probability 0 at it anyway (the gap to the
# next token would have to be below 1e-38), so it decodes greedily.
GREEDY_BELOW_TEMPERATURE = 1.1754943508222875e-38
MAX_TOP_K = 1 << 20  # the largest vocabulary (store.models.presets.BOUNDS)
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256


class GenerationSettings(TextChecked):
    """How to continue a prompt: sampling, where to stop, and the seed.

    Same seed, same prompts, same hardware: same text. A completion ends at the model's
    end-of-text token, at the first stop string (which is not part of it) or after
    `max_new_tokens`, whichever comes first.
    """

    # As store.specs.Spec (unknown fields refused, a value once made, every string text),
    # written out rather than inherited so that store.specs can import this module.
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: StrictInt = Field(
        128,
        ge=1,
        le=MAX_NEW_TOKENS,
        description="Most tokens to generate per prompt; the prompt and these must fit the "
        "model's max_seq_len.",
    )
    temperature: StrictFloat = Field(
        0.8,
        le=MAX_TEMPERATURE,
        # Published as the schema's minimum; the validator below says it in words.
        json_schema_extra={"minimum": 0},
        description="Divides the logits before sampling: below 1 sharper, above 1 flatter; "
        "0 is greedy (always the most likely token, no randomness), and so is any "
        f"temperature below {GREEDY_BELOW_TEMPERATURE:.4g} (float32's smallest normal number, "
        "where only the most likely token keeps any probability).",
    )
    top_k: StrictInt | None = Field(
        200,
        ge=1,
        le=MAX_TOP_K,
        description="Sample only among the k most likely tokens; null: no limit. 1 is greedy.",
    )
    top_p: StrictFloat = Field(
        1.0,
        gt=0,
        le=1,
        description="Nucleus sampling: sample only among the most likely tokens whose "
        "probabilities add up to top_p (at least one token); 1: no limit.",
    )
    stop: list[str] = Field(
        default_factory=list,
        max_length=MAX_STOP_STRINGS,
        description="Strings that end a completion where they first appear in its text; "
        f"the stop string is left out. At most {MAX_STOP_STRINGS}, each 1 to "
        f"{MAX_STOP_LENGTH} characters.",
    )
    seed: StrictInt = Field(
        0, ge=0, le=2**31 - 1, description="Seed of the sampling: same seed, same text."
    )

    @field_validator("temperature")
    @classmethod
    def _temperature_not_negative(cls, v: float) -> float:
        if v < 0:
            raise ValueError(
                f"temperature must be >= 0 (0 decodes greedily: the most likely token), got {v}"
            )
        return v

    @field_validator("stop")
    @classmethod
    def _stop_strings_bounded(cls, v: list[str]) -> list[str]:
        for s in v:
            if not 1 <= len(s) <= MAX_STOP_LENGTH:
                raise ValueError(
                    f"each stop string must be 1 to {MAX_STOP_LENGTH} characters, got one of "
                    f"{len(s)}"
                )
        return v

    @property
    def greedy(self) -> bool:
        """Whether every step takes the most likely token: nothing random is left."""
        return self.temperature < GREEDY_BELOW_TEMPERATURE or self.top_k == 1


def check_context(prompt_tokens: int, max_new_tokens: int, max_seq_len: int) -> None:
    """Refuse a prompt that, with the tokens to generate, would not fit the model's context.

    Raises InvalidRequest (a 422 at the API) naming the limit and what to shorten.
    """
    if prompt_tokens >= max_seq_len:
        raise InvalidRequest(
            f"prompt of {prompt_tokens} tokens leaves no room in the model's context "
            f"(max_seq_len {max_seq_len}) for a new token; shorten it"
        )
    if prompt_tokens + max_new_tokens > max_seq_len:
        raise InvalidRequest(
            f"prompt of {prompt_tokens} tokens + max_new_tokens {max_new_tokens} = "
            f"{prompt_tokens + max_new_tokens} exceeds the model's context (max_seq_len "
            f"{max_seq_len}); lower max_new_tokens to at most "
            f"{max_seq_len - prompt_tokens} or shorten the prompt"
        )
