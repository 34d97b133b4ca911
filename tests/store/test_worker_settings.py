"""A worker setting is one field of `WorkerSettings` (store/worker_settings.py): every field
reaches the service's local workers, the ranks of a multi-process run, the worker's command
line and its environment, and has its row in docs/operations.md. Parametrized over the
fields, so a new one is covered without a new test."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin

import pytest
from annotated_types import Ge, Gt
from pydantic.fields import FieldInfo

from tests.support.ranks import tiny_plan
from tests.support.supervisor import spawned_envs
from trainctl.service.settings import Settings
from trainctl.store.worker_settings import NodeSettings, WorkerSettings, flag, variable
from trainctl.worker.launch import LOOPBACK, build_job, child_env

REPO = Path(__file__).resolve().parents[2]
FIELDS = sorted(WorkerSettings.model_fields)


def example(name: str, tmp_path: Path) -> Any:
    """A value of setting `name` that is neither its worker's nor its service's default."""
    field = WorkerSettings.model_fields[name]
    kind = value_type(field)
    at_least = [m.ge for m in field.metadata if isinstance(m, Ge)]
    above = [m.gt for m in field.metadata if isinstance(m, Gt)]
    low = at_least[0] if at_least else above[0] if above else 0
    if field.examples:
        value = field.examples[0]
    elif kind is Path:
        value = tmp_path / name
    elif kind is str:
        value = f"{name}-example".replace("_", "-")
    elif kind is int:
        value = int(str(low)) + 7
    else:
        value = float(str(low)) + 1.5
    defaults = {field.default, getattr(Settings.model_fields.get(name), "default", None)}
    assert value not in defaults, f"{name}: pick an example that is no default"
    return value


def value_type(field: FieldInfo) -> type:
    kind = field.annotation
    if get_origin(kind) in (Union, UnionType):
        [kind] = [a for a in get_args(kind) if a is not NoneType]
    assert isinstance(kind, type)
    return kind


@pytest.mark.parametrize("name", FIELDS)
def test_the_variable_sets_every_setting(name: str, tmp_path: Path) -> None:
    value = example(name, tmp_path)

    settings = WorkerSettings.from_args([], {variable(name): str(value)})

    assert getattr(settings, name) == value


@pytest.mark.parametrize("name", FIELDS)
def test_the_flag_sets_every_setting(name: str, tmp_path: Path) -> None:
    value = example(name, tmp_path)
    flag_name = flag(name, WorkerSettings.model_fields[name])

    settings = WorkerSettings.from_args([flag_name, str(value)], {})

    assert getattr(settings, name) == value


@pytest.mark.parametrize("name", FIELDS)
def test_the_supervisor_hands_every_setting_to_its_local_workers(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the service's settings came from (here: arguments, not the environment)."""
    value = example(name, tmp_path)
    if name == "data_dir":
        [env] = spawned_envs(value, monkeypatch, gpus=0)
    elif name in NodeSettings.model_fields:
        [env] = spawned_envs(tmp_path, monkeypatch, gpus=0, **{name: value})
    else:  # a worker's own: the supervisor gives each one its own
        [env] = spawned_envs(tmp_path, monkeypatch, gpus=0)
        value = env[variable(name)]
        assert value

    assert getattr(WorkerSettings.from_args([], env), name) == value


@pytest.mark.parametrize("name", FIELDS)
def test_the_rank_job_file_carries_every_setting(name: str, tmp_path: Path) -> None:
    value = example(name, tmp_path)
    settings = WorkerSettings(**{name: value})

    job = json.loads(json.dumps(build_job(tiny_plan(), settings, None, None, tmp_path / "j")))
    env = child_env(settings, LOOPBACK, gang=False)

    assert getattr(WorkerSettings.from_job(job["settings"], env), name) == value


@pytest.mark.parametrize("name", FIELDS)
def test_every_setting_has_its_row_in_the_settings_table_naming_its_flag(name: str) -> None:
    """Its default there is checked by tests/test_docs.py."""
    table = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    row = re.search(rf"^\| `{variable(name)}` \|.*$", table, re.MULTILINE)

    assert row is not None, f"docs/operations.md has no row for {variable(name)}"
    assert f"Worker flag `{flag(name, WorkerSettings.model_fields[name])}`" in row.group(0)


def test_flags_beat_variables_and_an_empty_variable_is_unset() -> None:
    environ = {"TRAINCTL_LEASE_SECONDS": "12", "TRAINCTL_HEARTBEAT_SECONDS": "3"}

    settings = WorkerSettings.from_args(["--lease-seconds", "20"], {**environ, "TRAINCTL_NICE": ""})

    assert (settings.lease_seconds, settings.heartbeat_seconds, settings.worker_nice) == (20, 3, 0)


def test_a_bad_setting_stops_the_worker_naming_where_it_came_from(
    capsys: pytest.CaptureFixture[str],
) -> None:
    environ = {"TRAINCTL_DRAIN_SECONDS": "0", "TRAINCTL_STORAGE_URL": "bucket"}

    with pytest.raises(SystemExit) as stopped:
        WorkerSettings.from_args(["--nice", "25", "--rendezvous-port", "x"], environ)

    error = capsys.readouterr().err
    assert stopped.value.code == 2
    assert "--nice must be between 0 and 19, got 25" in error
    assert "TRAINCTL_DRAIN_SECONDS must be above 0 and at most 3600, got 0" in error
    assert "TRAINCTL_STORAGE_URL: storage URL 'bucket': expected s3://bucket" in error
    assert "--rendezvous-port: Input should be a valid integer" in error


def test_a_worker_completes_what_its_settings_leave_to_it(tmp_path: Path) -> None:
    """The data dir absolute, the default database in it, a name, a node and an address."""
    relative = Path("data")

    settings = WorkerSettings.from_args(["--data-dir", str(relative)], {})

    assert settings.data_dir == relative.resolve()
    assert settings.database_url == f"sqlite:///{relative.resolve() / 'trainctl.db'}"
    assert settings.worker_id and settings.node_name and settings.worker_address


def test_the_job_file_holds_no_secret_and_a_child_inherits_no_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    password = "postgresql+psycopg://u:hunter2@db/t"
    monkeypatch.setenv("TRAINCTL_WORKER_NICE", "19")  # the worker's own environment, not its
    settings = WorkerSettings(database_url=password, data_dir=tmp_path)

    job = build_job(tiny_plan(), settings, None, None, tmp_path / "job.json")
    env = child_env(settings, LOOPBACK, gang=False)

    assert "hunter2" not in json.dumps(job)
    assert env["TRAINCTL_DATABASE_URL"] == password
    assert "TRAINCTL_WORKER_NICE" not in env
    assert WorkerSettings.from_job(job["settings"], env) == settings


def test_the_service_embeds_every_node_setting_and_names_each_worker() -> None:
    shared = set(Settings.model_fields) & set(WorkerSettings.model_fields)

    assert shared == set(NodeSettings.model_fields)
    assert set(WorkerSettings.model_fields) - shared == {"worker_id"}
    assert Settings().worker_nice == 10 and WorkerSettings().worker_nice == 0
