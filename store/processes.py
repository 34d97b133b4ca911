"""How trainctl starts its own Python processes: isolated from the environment it runs in
(docs/architecture.md, "Rooms").

The service starts workers, a worker starts torchrun, torchrun starts the ranks, and a
prepare run spawns tokenizers. None of them may import code from where they happen to run:
the working folder, `PYTHONPATH` or the user's site-packages, where a planted `torch/` or
`fastapi/` would shadow the installed one. Each starts as `python -I` (no `PYTHON*`
variables, no user site, no working folder on `sys.path`), and its environment holds no
`PYTHON*` variable either, so that an interpreter it starts in turn (torch's compile
workers, a shell's `python`) is not led astray. Plug-ins installed into the environment
still load: they are found through its site-packages, by their entry points.

The one path a child is given is the folder this process imported `trainctl` from, when
that is not already on an isolated interpreter's path (a source checkout, or an editable
install): the child then runs the same trainctl as its parent, and nothing else.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

import trainctl

# `python -I -c BOOT ROOT MODULE ARGS...` is `python -I -m MODULE ARGS...` with ROOT on
# sys.path (first, unless an isolated interpreter has it already, as it has site-packages).
_BOOT = (
    "import runpy, sys; root = sys.argv.pop(1); "
    "root in sys.path or sys.path.insert(0, root); "
    "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
)
OUTERMOST_FRAME = 'File "<string>", line 1 in <module>'
"""The outermost frame of the main thread of every process `python_command` starts (the `-c`
boot above), as faulthandler writes it."""


def trainctl_root() -> str:
    """The folder holding the `trainctl` package this process runs."""
    return str(Path(trainctl.__file__).resolve().parent.parent)


def python_command(module: str, *args: str, unbuffered: bool = False) -> list[str]:
    """The argv that runs `python -m module args` isolated, with this process's trainctl."""
    flags = ["-I", "-u"] if unbuffered else ["-I"]
    return [sys.executable, *flags, "-c", _BOOT, trainctl_root(), module, *args]


def isolated_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without the variables that steer a Python interpreter (`PYTHONPATH`,
    `PYTHONHOME`, `PYTHONSTARTUP`, ...): a child's children are isolated too."""
    return {k: v for k, v in environ.items() if not k.startswith("PYTHON")}


def drop_working_folder() -> None:
    """Undo what `python -m` does: it puts the working folder first on `sys.path`, so that a
    `fastapi/` there would be imported instead of the installed one. Called by a `__main__`
    before it imports anything else; a no-op under `-P` or `-I`, or for a console script."""
    if not sys.flags.safe_path and sys.path and sys.path[0] in (os.getcwd(), ""):
        del sys.path[0]


DRAINED_EXIT_CODE = 75
"""A worker's exit code after it was drained on purpose (POST /workers/{id}/drain): its
supervisor does not start it again. 75 is EX_TEMPFAIL of <sysexits.h>: the node is going
away, not broken."""
