"""`trainctl submit --spec FILE` in YAML or JSON, shell completion and --version, against a real
service with no workers (submitted runs stay queued)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.service.cli.invoke import NO_CONFIG, trainctl
from tests.support.service_process import REPO, Service

SPEC_YAML = """\
# a train run, as a person would write it
experiment: {experiment}
steps: 7
data:
  source: synthetic
batch:
  seq_len: 32
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["spec.yaml", "spec.yml"])
def test_a_yaml_spec_file_is_read_and_flags_override_it(
    service: Service, tmp_path: Path, name: str
) -> None:
    experiment = name.replace(".", "-")  # one active train run per experiment
    (tmp_path / name).write_text(SPEC_YAML.format(experiment=experiment))

    code, out, err = trainctl(
        service, "submit", "train", "--spec", str(tmp_path / name), "--steps", "9", "--json"
    )

    assert code == 0, err
    spec = json.loads(out)["spec"]
    assert spec["experiment"] == experiment and spec["data"]["source"] == "synthetic"
    assert spec["batch"]["seq_len"] == 32 and spec["steps"] == 9


@pytest.mark.slow
def test_any_other_spec_file_is_read_as_json(service: Service, tmp_path: Path) -> None:
    (tmp_path / "spec.txt").write_text(json.dumps({"steps": 5, "warmup_steps": 0}))

    code, out, err = trainctl(service, "submit", "benchmark", "--spec", str(tmp_path / "spec.txt"))

    assert code == 0 and out.startswith("submitted benchmark run "), err
    assert err.startswith("follow it: trainctl runs watch ")  # a hint: not data, on stderr


@pytest.mark.parametrize(
    ("name", "text", "problem"),
    [
        ("bad.yaml", "steps: 7\n  batch: 3\n", "is not valid YAML: line 2, column 8: "),
        ("bad.json", '{"steps": 7,}', "is not valid JSON: Expecting property name"),
        ("list.yml", "- steps: 7\n", ": a spec is a mapping of fields, not list"),
        ("empty.yaml", "# nothing yet\n", " is empty"),
        ("date.yaml", "experiment: 2025-01-01\n", "is not JSON serializable; quote the value"),
    ],
)
def test_a_malformed_spec_file_is_one_error_naming_the_file_and_the_problem(
    tmp_path: Path, name: str, text: str, problem: str
) -> None:
    path = tmp_path / name
    path.write_text(text)

    code, out, err = trainctl(None, "submit", "train", "--spec", str(path))

    assert code == 2 and out == ""
    assert err.startswith(f"error: {path}") and problem in err and err.count("\n") == 1


def test_a_missing_spec_file_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = trainctl(None, "submit", "train", "--spec", str(tmp_path / "nope.yaml"))

    assert code == 2 and err.startswith("error: Invalid value for '--spec': ")


def test_version_prints_the_installed_version() -> None:
    code, out, _ = trainctl(None, "--version")

    assert code == 0 and out == f"trainctl {version('trainctl')}\n"


@pytest.mark.slow
def test_show_completion_prints_a_bash_script_that_completes_commands() -> None:
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(NO_CONFIG),
        "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1",  # take the shell as a value
    }
    trainctl_script = str(Path(sys.executable).parent / "trainctl")

    script = subprocess.run(
        [trainctl_script, "--show-completion", "bash"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=120,
    )  # fmt: skip
    completed = subprocess.run(
        [trainctl_script],
        capture_output=True, text=True, cwd=REPO, timeout=120,
        env={**env, "_TRAINCTL_COMPLETE": "complete_bash", "COMP_WORDS": "trainctl runs lo",
             "COMP_CWORD": "2"},
    )  # fmt: skip

    assert script.returncode == 0 and "complete -o default -F _trainctl_completion trainctl" in (
        script.stdout
    )
    assert "_TRAINCTL_COMPLETE=complete_bash" in script.stdout  # what the shell will ask
    assert completed.returncode == 0 and completed.stdout.split() == ["logs"]
