"""Response (and non-run request) models of the API: the only definition of its JSON
(docs/design/shapes.md, "Shapes clients rely on").

Run requests are the bodies of the submit routes and live in store/kinds/; everything here
describes what the API sends back, so the OpenAPI schema documents it and FastAPI checks each
response against it. The store returns plain records (`Run`, `Event`, `Worker`,
`CheckpointInfo`); `Model.model_validate(record)` reads them by attribute
(`from_attributes`), so the store never knows the API's shapes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt

from trainctl.service.webhooks.targets import MAX_URL_LENGTH, URL_PATTERN, URL_RULE, check_url
from trainctl.store.db.placement import Spread
from trainctl.store.names import ExperimentName, Name
from trainctl.store.registry import Ref, RegisteredName
from trainctl.store.text import TextChecked
from trainctl.store.vocabulary import (
    METRIC_KINDS_TEXT,
    SHORT_ID_TEXT,
    EventType,
    RunState,
    Scope,
    WebhookEvent,
)

ServedKindName = Annotated[
    str, RegisteredName(Ref("trainctl.store.kinds.registry:RUN_KINDS"), check=False)
]
"""A run kind's name as the server answers it: the schema of store.kinds.registry.RunKindName,
any name read (a client need not know the server's plug-ins). The registry is named, not
imported: the SDK reads these models without loading the run kinds."""


class ErrorPublic(BaseModel):
    """Every error answer: what is wrong and what to do about it, in words."""

    detail: str


class ValidationErrorPublic(ErrorPublic):
    """A request that failed validation: `detail` names the bad fields in one string (the
    first 50, and how many more)."""

    errors: list[dict[str, Any]] = Field(
        default_factory=list,
        description="pydantic's errors (loc, msg, type, ctx), the first 50, for programs; "
        "absent when the "
        "request was well-formed but the service refused it (an unknown checkpoint to resume).",
    )


class Public(BaseModel):
    """A response model that can be read from a store record's attributes."""

    model_config = ConfigDict(from_attributes=True)


class ProgressPublic(Public):
    step: int = Field(
        description="Optimizer steps done (measured steps for a benchmark, documents for a "
        "prepare)."
    )
    total_steps: int | None = Field(
        description="Steps the run will take, once known (never, for a prepare)."
    )


class PlacementPublic(Public):
    # The docstring is the API schema's description, kept as it was published: Placement lives
    # in store/db/placement.py.
    """What the workers that take a run must have (store.placement.Placement)."""

    nnodes: int = Field(description="Workers (nodes) that take the run together.")
    gpus_per_node: int = Field(description="GPUs each of them needs; 0: the run is on the CPU.")
    procs_per_node: int = Field(description="Processes each of them runs.")
    spread: Spread = Field(
        description="any: on any nodes; same_node: all on one node name; distinct_nodes: "
        "each on a node name of its own."
    )
    min_nnodes: int | None = Field(
        None,
        description="An elastic gang's fewest nodes: after waiting shrink_after_seconds "
        "for all nnodes it runs on as few as this; null: exactly nnodes.",
    )
    shrink_after_seconds: float = Field(
        0.0, description="How long an elastic gang waits for all its nnodes workers."
    )
    avoid_nodes: list[str] = Field(
        default_factory=list,
        description="Nodes the run's next attempt keeps clear of where enough others can take "
        "it: the nodes of its stragglers as last reported, for a run that asked for that "
        "(stragglers.avoid); empty otherwise.",
    )


class ParentPublic(Public):
    """Where a fork started (docs/architecture.md, "Forks")."""

    run_id: str | None = Field(
        description="The run that saved the checkpoint; null where its metadata names none."
    )
    experiment: str = Field(description="The parent checkpoint's experiment.")
    tag: str = Field(description="The parent checkpoint's tag.")
    step: int = Field(description="Its step: the fork's first step continues from it.")


class JobPublic(Public):
    """One job a launch backend submitted for a run (a Slurm job)."""

    backend: str = Field(description="Which scheduler: slurm.")
    job_id: str = Field(description="The scheduler's id (squeue, scancel, scontrol show job).")
    attempt: int = Field(description="The run's attempt it was submitted (or claimed) for.")
    state: str = Field(
        description="The scheduler's state as last seen: PENDING, RUNNING, COMPLETED, "
        "CANCELLED, NODE_FAIL, TIMEOUT ..., or GONE for a job it no longer lists."
    )
    reason: str | None = Field(description="Why a pending job waits (Resources, Priority ...).")
    nodes: str | None = Field(description="The nodes it ran on.")
    submitted_at: datetime
    claimed_at: datetime | None = Field(description="When its worker started the run.")
    ended_at: datetime | None


class RunPublic(Public):
    id: str
    short_id: str = Field(description=SHORT_ID_TEXT)
    kind: ServedKindName
    experiment: str = Field(
        description="Train: the request's; validate: the checkpoint's; prepare: the dataset's name."
    )
    state: RunState
    spec: dict[str, Any] = Field(
        description="The run's plan: every default filled in, any checkpoint it reads pinned."
    )
    progress: ProgressPublic
    result: dict[str, Any] | None = Field(description="Set when the run succeeded.")
    error: str | None = Field(description="Why the run failed, in words.")
    worker_id: str | None
    attempt: int = Field(
        description="1 on the first try; grows when a dead worker's run is requeued."
    )
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    submitted_by: str | None = Field(
        description="The name of the API token that submitted the run; null without tokens."
    )
    priority: int = Field(description="Claims take the highest priority first, then the oldest.")
    max_attempts: int = Field(description="Attempts before the run fails.")
    placement: PlacementPublic
    gang_nnodes: int | None = Field(
        None,
        description="The nodes a gang's current (or last) attempt was placed on: nnodes, or "
        "fewer for an elastic gang that shrank; null for a run never placed as a gang.",
    )
    waiting_reason: str | None = Field(
        description="Why a queued run waits: no live worker could take it (for example "
        "'waiting: needs 8 GPUs per node; largest worker has 4'); null otherwise, and for a "
        "queued run that waits only for a worker to be free."
    )
    parent: ParentPublic | None = Field(
        None, description="A fork's parent: run, checkpoint and step; null for no fork."
    )
    jobs: list[JobPublic] = Field(
        default_factory=list,
        description="The scheduler jobs its attempts ran in, oldest first (TRAINCTL_BACKEND="
        "slurm); empty where workers claim runs from the queue.",
    )
    wandb_url: str | None = Field(
        None,
        description="The run's page on Weights & Biases, where the service mirrors it there "
        "(its trackers name 'wandb') and can name the page (TRAINCTL_WANDB_ENTITY set, mode "
        "online); null otherwise.",
    )


class RunsPublic(BaseModel):
    items: list[RunPublic]
    next_cursor: str | None = Field(
        description="Pass as ?cursor= for the next page; null at the end."
    )


class ForkSweepPublic(BaseModel):
    """The runs a sweep queued: one per variant, in the variants' order."""

    items: list[RunPublic]


class LineageRunPublic(Public):
    """A run of a lineage tree, in brief (GET /runs/{id} has the rest)."""

    id: str
    short_id: str = Field(description=SHORT_ID_TEXT)
    kind: ServedKindName
    experiment: str
    state: RunState
    progress: ProgressPublic
    created_at: datetime
    parent: ParentPublic | None = Field(description="Where the run was forked from.")


class LineageNodePublic(LineageRunPublic):
    forks: list[LineageNodePublic] = Field(
        description="The runs forked from this run's checkpoints, oldest first."
    )


class LineagePublic(BaseModel):
    """A run's place among forks: its ancestors and its descendants."""

    ancestors: list[LineageRunPublic] = Field(
        description="From the root down to the run's parent; a parent run that is gone ends "
        "the list."
    )
    run: LineageRunPublic
    forks: list[LineageNodePublic] = Field(
        description="The runs forked from the run's checkpoints, each with its own forks, "
        "oldest first."
    )


class EventPublic(Public):
    """One entry of a run's event log, as each SSE frame's `data` carries it."""

    id: int = Field(description="Increases across the whole log; the SSE id.")
    run_id: str
    type: EventType
    data: dict[str, Any]
    created_at: datetime


class StreamEndPublic(BaseModel):
    """The `data` of the final `event: end` frame of a finished run's event stream."""

    run_id: str
    state: RunState


class MetricPublic(BaseModel):
    """One metrics event: the worker's numbers (step, loss, lr/muon, ...) flattened in; an old
    event log's lr_muon and lr_adamw under today's names, lr/muon and lr/adamw."""

    model_config = ConfigDict(extra="allow")

    event_id: int
    created_at: datetime
    kind: str | None = Field(None, description=METRIC_KINDS_TEXT)


class MetricsPublic(BaseModel):
    items: list[MetricPublic]


class StragglerPublic(BaseModel):
    """A change of a run's stragglers (docs/design/hangs.md, "Stragglers")."""

    step: int
    slowdowns: dict[str, float] = Field(
        description="By rank: its median own step time over the other ranks', minus 1 "
        "(0.25: 25 % slower); {} once no rank is a straggler any more."
    )
    nodes: dict[str, str] = Field(
        default_factory=dict, description="By rank: the node each straggler runs on."
    )
    avoid_nodes: list[str] | None = Field(
        None,
        description="For a run that avoids its stragglers' nodes (stragglers.avoid): the "
        "nodes its next attempt keeps clear of from now on; null for other runs.",
    )
    threshold: float
    window: int


class HangPublic(BaseModel):
    """A hang that stopped an attempt (docs/design/hangs.md, "Hangs")."""

    ranks: list[int] = Field(description="The ranks past their timeout, the longest first.")
    step: int = Field(description="The last step the first of them finished.")
    phase: str = Field(description="What it was in: a training step, or a validation, "
                       "sample or save.")  # fmt: skip
    late_seconds: float = Field(description="How long past its timeout it was declared hung.")


class LogPublic(BaseModel):
    event_id: int
    created_at: datetime
    level: str
    message: str
    straggler: StragglerPublic | None = Field(
        None, description="On a straggler report: the ranks that are stragglers now."
    )
    hang: HangPublic | None = Field(None, description="On a hang: what was declared hung.")
    health: dict[str, Any] | None = Field(
        None,
        description="A loss-health intervention's record (docs/design/health.md): step, loss, "
        "grad_norm, reason, action, statistic, window, rewound_to; absent on other lines.",
    )


class LogsPublic(BaseModel):
    items: list[LogPublic]


class FilePublic(Public):
    name: str
    size: int
    sha256: str


class TokenizerPublic(Public):
    kind: Literal["bytes", "bpe"] = Field(
        description="bytes: a token is a byte; bpe: the tokenizer.json among the files."
    )
    sha256: str | None = Field(description="Of that tokenizer.json; null for bytes.")


class CheckpointPublic(Public):
    experiment: str
    tag: str
    step: int | None
    token_count: int | None
    best_loss: float | None
    run_id: str | None
    created_at: str | None = Field(description="ISO 8601, as the writer recorded it.")
    size_bytes: int
    files: list[FilePublic]
    tokenizer: TokenizerPublic | None = Field(
        None,
        description="The tokenizer of its training data; null when unknown (synthetic "
        "tokens, bare shards, a checkpoint saved before trainctl recorded it).",
    )
    source_tokens: dict[str, int] | None = Field(
        None,
        description="A data mixture's tokens trained on from each of its datasets, by name "
        "(they add up to token_count for a run that trained on the mixture from its start); "
        "null for a run of one source.",
    )


class CheckpointsPublic(BaseModel):
    items: list[CheckpointPublic]
    next_cursor: str | None = Field(None, description="Always null: checkpoints fit one page.")


class PruneRequest(TextChecked):
    model_config = ConfigDict(extra="forbid")

    experiment: ExperimentName
    # Strict like the run specs: `true` is not a count and "no" is not a boolean.
    keep_last: StrictInt = Field(
        ge=0, le=1_000_000, description="step_* checkpoints to keep; the latest always stays."
    )
    keep_best: StrictBool = Field(
        True, description="Also keep the step that 'best' was copied from."
    )
    dry_run: StrictBool = Field(False, description="Report what would be deleted; delete nothing.")


class PruneResult(Public):
    deleted: list[CheckpointPublic]
    kept: list[CheckpointPublic]
    dry_run: bool


class WorkerPublic(Public):
    id: str
    host: str
    pid: int
    device: str
    node_name: str = Field(
        description="The node it runs on (TRAINCTL_NODE_NAME, by default the host name); "
        "workers of one node share it."
    )
    gpus: int = Field(description="GPUs it has; it takes runs that need at most this many.")
    gpu_model: str | None = Field(description="Its first GPU's model; null without GPUs.")
    gpu_memory_bytes: int | None = Field(
        description="Its smallest GPU's memory; null without GPUs."
    )
    cpus: int = Field(description="CPU cores it may use.")
    address: str | None = Field(
        description="Where the other members of a multi-node run reach it (the rendezvous "
        "host, when it leads one); null when it has not said."
    )
    model_plugins: list[str] = Field(
        description="The plug-in models installed where it runs (docs/models.md)."
    )
    hf_model_types: list[str] = Field(
        description="The transformers causal-LM model types it builds (docs/models.md); "
        "empty from a worker that did not report them."
    )
    info: dict[str, Any]
    started_at: datetime
    last_seen_at: datetime
    current_run_id: str | None
    alive: bool = Field(description="Seen within the lease period.")
    drain_requested_at: datetime | None = Field(
        description="When it was asked to drain (POST /workers/{id}/drain); null: it was not."
    )
    draining: bool = Field(
        description="Asked to drain: it hands back its run, claims nothing more and exits."
    )


class WorkersPublic(BaseModel):
    items: list[WorkerPublic]


class PresetPublic(Public):
    name: str = Field(description='A built-in preset: `model: {"preset": <name>}`.')
    description: str
    params: int = Field(description="Its parameters, counted from its shapes.")
    flops_per_token: int = Field(
        description="Training FLOPs per token at its max_seq_len: 6 x matmul parameters + "
        "12 x layers x d_model x seq_len (forward and backward, attention included)."
    )
    vocab_size: int
    max_seq_len: int


class PluginModelPublic(Public):
    name: str = Field(
        description='A plug-in model: `model: {"plugin": {"name": <name>, "config": {...}}}`.'
    )
    workers: list[str] = Field(description="The live workers that have it installed.")


class ModelsPublic(BaseModel):
    """The models a request may name (docs/models.md)."""

    presets: list[PresetPublic]
    plugins: list[PluginModelPublic] = Field(
        description="The plug-in models installed on the live workers."
    )
    hf_model_types: list[str] | None = Field(
        description='The transformers model types `model: {"hf": {"model_type": ...}}` '
        "accepts: those the live workers reported when they registered (the causal LMs of "
        "the transformers installed where they run), or, while none has, those of the "
        "service's own transformers; null where neither is known, and then the worker "
        "checks the model type."
    )
    hf_model_types_from: Literal["workers", "service"] | None = Field(
        description="Where `hf_model_types` comes from: the live workers' reports, or the "
        "service's own catalog (no live worker reported any)."
    )


class EvalTaskPublic(Public):
    name: str = Field(description="What an evaluate run names it (`tasks`).")
    size: int = Field(description="Items in its evaluated split: the most a limit takes.")
    split: str = Field(description="The split it is evaluated on.")
    fewshot_split: str = Field(description="The split its few-shot examples come from.")
    max_fewshot: int = Field(description="The most few-shot examples an item may have.")
    metrics: list[str] = Field(description="What it reports, as `eval/<task>/<metric>`.")


class EvalTasksPublic(BaseModel):
    """The downstream tasks an evaluate run scores a checkpoint on (docs/evals.md)."""

    items: list[EvalTaskPublic]


class EvalItemPublic(BaseModel):
    """One item's prediction, named as lm-evaluation-harness's samples name them."""

    doc_id: int = Field(description="The item's place among the task's first `limit` items.")
    gold: int = Field(description="The index of the right choice.")
    pred: int = Field(description="The choice of the largest log-likelihood.")
    pred_norm: int = Field(description="The choice of the largest log-likelihood per character.")
    acc: float = Field(description="1.0 where `pred` is `gold`, else 0.0.")
    acc_norm: float = Field(description="1.0 where `pred_norm` is `gold`, else 0.0.")
    loglikelihoods: list[float] = Field(description="Each choice's log-likelihood, in order.")


class EvalItemsPublic(BaseModel):
    """A page of an evaluate run's predictions for one task (docs/evals.md)."""

    task: str
    total: int = Field(
        description="Items the run has scored of the task: all of them once the task ends "
        "(a retried run's count from its latest attempt)."
    )
    offset: int
    next_offset: int | None = Field(description="The next page's offset; null on the last.")
    items: list[EvalItemPublic]


class HealthPublic(BaseModel):
    status: Literal["ok"]


class ReadinessPublic(BaseModel):
    status: Literal["ready"]
    database: Literal["ok"]
    workers_alive: int


class TokenCreate(TextChecked):
    """An API token to create: its name and what it may do."""

    model_config = ConfigDict(extra="forbid")

    name: Name = Field(description="Who holds it: a person, a team, a pipeline.")
    scope: Scope = Field(
        description="read: every GET; submit: also submit and cancel runs; admin: all, "
        "including deleting and pruning checkpoints and managing tokens."
    )


class TokenPublic(Public):
    name: str
    scope: Scope
    created_by: str | None = Field(description="The token that created it.")
    created_at: datetime
    last_used_at: datetime | None = Field(description="To the minute; null if never used.")


class TokenCreated(TokenPublic):
    token: str = Field(description="The token itself: shown this once, never again.")


class TokensPublic(BaseModel):
    items: list[TokenPublic]


# --- webhooks (service/webhooks; docs/design/webhooks.md, "Webhooks") ---------------------------

TERMINAL_EVENTS: list[WebhookEvent] = ["cancelled", "failed", "succeeded"]


class WebhookCreate(TextChecked):
    """A URL to POST run state changes to, and which changes."""

    model_config = ConfigDict(extra="forbid")

    url: Annotated[
        str,
        Field(
            max_length=MAX_URL_LENGTH,
            description=f"Where to POST: {URL_RULE}. No user name or password: receivers "
            "check the signature. Where it may connect is checked when it does "
            "(TRAINCTL_WEBHOOK_ALLOWED_HOSTS).",
            json_schema_extra={"pattern": URL_PATTERN},
        ),
        AfterValidator(check_url),
    ]
    events: list[WebhookEvent] = Field(
        default_factory=lambda: list(TERMINAL_EVENTS),
        min_length=1,
        description="The states whose entry is notified; default the terminal ones. `queued` "
        "is a run put back in the queue (a lost worker, a hang), never its submission. Besides "
        "the states, the alerts of a running run: `straggler`, a change of its stragglers, and "
        "`hang`, an attempt stopped because a rank hung (docs/design/hangs.md); `health`, a "
        "train run's loss-health intervention (a skipped step, a rewind; docs/design/health.md).",
    )


class WebhookPublic(Public):
    id: int
    url: str
    events: list[WebhookEvent]
    created_by: str | None = Field(description="The token that registered it.")
    created_at: datetime


class WebhookCreated(WebhookPublic):
    secret: str = Field(
        description="The key of every delivery's HMAC-SHA256 signature: shown this once."
    )


class WebhooksPublic(BaseModel):
    items: list[WebhookPublic]


class DeliveryAttemptPublic(Public):
    """One try at sending a delivery, as the delivery log keeps it."""

    attempt: int
    started_at: datetime
    duration_ms: float
    status_code: int | None = Field(description="The receiver's answer; null when none came.")
    error: str | None = Field(description="Why no answer came (timeout, refused, ...), or null.")


class DeliveryPublic(Public):
    id: str = Field(description="The delivery id (X-Trainctl-Delivery): the same on retries.")
    webhook_id: int
    run_id: str
    event_id: int = Field(description="The run's event this delivery tells of.")
    event: WebhookEvent = Field(description="The state the run entered, or the alert.")
    state: Literal["pending", "succeeded", "failed"] = Field(
        description="succeeded: a 2xx came; failed: every attempt was used; pending: neither."
    )
    next_attempt_at: datetime | None = Field(description="When a pending delivery is tried next.")
    created_at: datetime
    attempts: list[DeliveryAttemptPublic]


class DeliveriesPublic(BaseModel):
    items: list[DeliveryPublic]


class EvalScoresPublic(BaseModel):
    """A task's newest scores in a run's log (docs/evals.md, "Reading the results")."""

    step: int = Field(description="The step of the checkpoint scored: the latest scored.")
    metrics: dict[str, float] = Field(
        description="By metric: acc, acc_norm, bits_per_byte (GET /evals/tasks lists each task's)."
    )


class WebhookPayload(BaseModel):
    """The JSON body of every delivery, signed in its X-Trainctl-Signature header."""

    delivery_id: str = Field(description="Deduplicate on it: a delivery may come twice.")
    event: WebhookEvent = Field(
        description="The state the run entered, or the alert (`straggler`, `hang`, `health`)."
    )
    previous: RunState = Field(
        description="The state it left; for an alert, the state it is in: running."
    )
    reason: str = Field(description="Why, in words (as the run's state or log event says).")
    event_id: int = Field(description="The run's `state` (or, for an alert, `log`) event.")
    alert: dict[str, Any] | None = Field(
        None,
        description="An alert's data, as GET /runs/{id}/logs shows them: a `straggler`'s "
        "{step, slowdowns, threshold, window}, a `hang`'s {ranks, step, phase, late_seconds}, "
        "or a `health` intervention's {step, loss, grad_norm, reason ('nonfinite', 'spike'), "
        "action ('log', 'skip', 'rewind', 'fail'), statistic (the z-score), window (the data "
        "positions [start, end) of the step), rewound_to}; null for a state change.",
    )
    occurred_at: datetime
    run: RunPublic = Field(
        description="The run when the delivery was made, which may be after the event: a "
        "run that started may have finished by then."
    )
    evals: dict[str, EvalScoresPublic] = Field(
        description="The run's newest eval scores by task, when the delivery was made: an "
        "evaluate run's own, and those recorded on a train run for its checkpoints; {} for a "
        "run never scored."
    )
