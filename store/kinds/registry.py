"""Run kinds by name: the one list of them (docs/design/kinds.md, "Run kinds").

Submit, admission, the routes (`POST /runs/<kind>`), the CLI and the worker read a kind's
record (`store.kinds.base.RunKind`) here, by its name or its plan. Each built-in kind is a
module of this shelf that declares its record beside its request, plan and resolver, and its
executor is the module of the same name in worker/kinds/; so a new built-in kind is those two
modules and a line here and in `worker.kinds.registry`. A plug-in declares its record under
the `trainctl.run_kinds` entry point group instead, with its executor under
`trainctl.executors`.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

from trainctl.store.db.placement import Placement
from trainctl.store.kinds.base import RunKind
from trainctl.store.kinds.benchmark import BENCHMARK
from trainctl.store.kinds.evaluate import EVALUATE
from trainctl.store.kinds.export import EXPORT
from trainctl.store.kinds.prepare import PREPARE
from trainctl.store.kinds.sample import SAMPLE
from trainctl.store.kinds.train import TRAIN
from trainctl.store.kinds.validate import VALIDATE
from trainctl.store.models.plugin import PluginModelConfig
from trainctl.store.plans import Plan
from trainctl.store.registry import RegisteredName, Registry

RUN_KINDS: Registry[RunKind] = Registry("run kind", group="trainctl.run_kinds")
# In this order: the API lists their routes and names so.
for _kind in (TRAIN, VALIDATE, BENCHMARK, PREPARE, SAMPLE, EXPORT, EVALUATE):
    RUN_KINDS.register(_kind.name, _kind)

RunKindName = Annotated[str, RegisteredName(RUN_KINDS)]
"""A run kind's name: the registered ones, published in the schema as an enum."""


def kind_of_plan(plan: Plan) -> RunKind:
    """The kind whose plan `plan` is."""
    for kind in RUN_KINDS:
        if type(plan) is kind.plan:
            return kind
    raise TypeError(f"no run kind has plans of type {type(plan).__name__}")


def placement_of(plan: Plan) -> Placement:
    """The kind's placement, and the plug-in model the plan's model is, if it is one: only
    workers that have it installed can build it."""
    placement = kind_of_plan(plan).placement(plan)
    model = getattr(plan, "model", None)
    config = getattr(model, "config", model)  # a ModelPlan's, or the config itself
    if isinstance(config, PluginModelConfig):
        placement = dataclasses.replace(placement, model_plugin=config.plugin)
    return placement
