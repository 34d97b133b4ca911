"""A spec that chooses one registered kind, and the settings model each kind brings
(docs/design/training.md, "Optimizers").

`OptimizerSpec` (store.training.optim) chooses an optimizer kind, `ParallelismSpec`
(store.training.parallelism) a parallel strategy. Each kind's record carries its own settings
model, a `KindSettings`: the settings its builder reads, each declared once with its bounds and
description. What the worker's builder receives is that model, typed (`KindChoice.settings`).

On the wire a spec stays flat, the kind's name beside its settings (`{"kind": "adamw",
"adamw_lr": 0.001}`), as it was before kinds had models. Not a pydantic discriminated union:
that would change the published schema (a oneOf per kind) and what clients send. Instead:

- the spec class inherits every built-in kind's settings model, so their fields are its own,
  declared once, and a plan holds each of them (at its default where its kind does not read
  it), as plans always have;
- a plug-in kind's settings arrive as extra fields: kept when the chosen kind's model declares
  them, checked by that model (a 422 at the field, `optimizer.lion_lr`), filled in at their
  defaults so that a plan holds them too, and listed in the schema beside the built-ins' (so
  the schema keeps `additionalProperties: false`: it names every setting a registered kind
  reads);
- a field the chosen kind does not read is refused by name, unless it is a built-in field at
  its default: what a plan sent back as a request carries; a name no registered kind reads is
  refused at the field ("Extra inputs are not permitted"), as it was when the spec forbade
  extra fields.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, Self

from pydantic import ConfigDict, GetJsonSchemaHandler, ValidationError, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import InitErrorDetails, core_schema

from trainctl.store.registry import Registry
from trainctl.store.text import TextChecked


# As a request's models (store.specs.Spec): Strict* numbers, so a value must have the JSON type
# the schema publishes; frozen, a value.
class KindSettings(TextChecked):
    """The settings one kind reads: the model its record names (`settings`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class KindRecord(Protocol):
    """What a choice reads of a kind's record (`OptimizerKind`, `ParallelStrategy`)."""

    @property
    def name(self) -> str: ...

    @property
    def settings(self) -> type[KindSettings]: ...


class KindChoice(TextChecked):
    """A spec naming one registered kind, the kinds' settings flat beside the name.

    A subclass declares its choice field first (in a base of its own, so that pydantic orders
    it before the settings fields) and says which field it is (`choice`), among which records
    (`kinds`) and what it chooses, in words (`what`); the spec then inherits every built-in
    kind's settings model."""

    model_config = ConfigDict(extra="allow", frozen=True)

    choice: ClassVar[str]
    """The field naming the kind: `kind`, `strategy`."""
    kinds: ClassVar[Registry[Any]]
    """The records it chooses among, each a `KindRecord`."""
    what: ClassVar[str]
    """What it chooses, in words, as its refusals say it: "optimizer kind"."""

    def chosen(self) -> KindRecord:
        """The record of the kind the spec names."""
        record: KindRecord = self.kinds.get(getattr(self, self.choice))
        return record

    @classmethod
    def common_fields(cls) -> frozenset[str]:
        """The fields every kind reads: those no kind's settings model declares (the choice
        itself; the optimizer's gradient clip, which is the training step's)."""
        models = [b for b in cls.__mro__ if issubclass(b, KindSettings) and b is not cls]
        return frozenset(cls.model_fields).difference(*(m.model_fields for m in models))

    def settings(self) -> KindSettings:
        """The chosen kind's settings, as its builder takes them."""
        model = self.chosen().settings
        return model.model_validate({name: getattr(self, name) for name in model.model_fields})

    @model_validator(mode="after")
    def _chosen_kind_reads_every_setting(self) -> Self:
        extra = self.__pydantic_extra__
        assert extra is not None  # extra="allow"
        # A name no registered kind reads is refused as before kinds had models: at the field.
        known = set().union(*(record.settings.model_fields for record in self.kinds))
        if unknown := [n for n in extra if n not in known]:
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(type="extra_forbidden", loc=(n,), input=extra[n])
                    for n in unknown
                ],
            )
        record = self.chosen()
        model = record.settings
        declared = type(self).model_fields
        reads = model.model_fields.keys() | self.common_fields()
        unread = sorted(
            n
            for n in self.model_fields_set
            if n not in reads and (n not in declared or getattr(self, n) != declared[n].default)
        )
        if unread:
            raise ValueError(
                f"{self.what} {record.name!r} does not read {', '.join(unread)}; remove "
                f"{'it' if len(unread) == 1 else 'them'}, or pick a {self.what.split()[-1]} "
                "that does"
            )
        sent = {n: getattr(self, n) for n in model.model_fields if n in declared or n in extra}
        # Its ValidationError is the spec's own, at the field: optimizer.lion_lr.
        settings = model.model_validate(sent)
        extra.update(
            (n, value) for n, value in settings.model_dump(mode="json").items() if n not in declared
        )
        return self

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        published = handler.resolve_ref_schema(handler(schema))
        properties: dict[str, Any] = published["properties"]
        for model in (record.settings for record in cls.kinds):
            # A built-in kind's fields are the spec's own already: only a plug-in's are added
            # (and only then is its model generated, so the built-ins' schema is as it was).
            if model.model_fields.keys() <= properties.keys():
                continue
            own = handler.resolve_ref_schema(handler(model.__pydantic_core_schema__))
            for field, field_schema in own["properties"].items():
                properties.setdefault(field, field_schema)
        published["additionalProperties"] = False
        return published
