"""An environment where a test plug-in package (tests/plugins/) is installed by pip, as an
operator would install one, so that the service and its isolated workers (`python -I`,
store/processes.py) discover its entry points by themselves.

The environment is a virtualenv that sees this environment's packages (torch, FastAPI, ...)
through a `.pth` line instead of installing them again.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sysconfig
import venv
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"


def pyproject(distribution: str, package: str, entry_points: dict[str, dict[str, str]]) -> str:
    """A pyproject.toml for `package` declaring `entry_points` ({group: {name: target}})."""
    groups = "".join(
        f'\n[project.entry-points."{group}"]\n'
        + "".join(f'{name} = "{target}"\n' for name, target in points.items())
        for group, points in entry_points.items()
    )
    return (
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{distribution}"\nversion = "1.0"\n{groups}\n'
        f'[tool.setuptools]\npackages = ["{package}"]\n'
    )


def install_plugin(env: Path, source: Path, package: str, pyproject_text: str) -> Path:
    """The python of a new virtualenv at `env` with tests/plugins/`package` installed (by
    pip, offline; `source` is a scratch folder to build it from)."""
    venv.create(env, symlinks=True)
    site_packages = Path(sysconfig.get_path("purelib", vars={"base": str(env)}))
    (site_packages / "_shared.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    shutil.copytree(PLUGINS / package, source / package)
    (source / "pyproject.toml").write_text(pyproject_text)
    python = env / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "--no-cache-dir", str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    return python


ECHO = pyproject(
    "trainctl-echo",
    "trainctl_echo",
    {
        "trainctl.run_kinds": {"echo": "trainctl_echo.kind:ECHO"},
        "trainctl.executors": {"echo": "trainctl_echo.executor:execute_echo"},
    },
)
"""The pyproject.toml of the `echo` run kind (tests/plugins/trainctl_echo)."""
