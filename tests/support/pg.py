"""A throwaway PostgreSQL 15 server for the tests: initdb in a temp dir, loopback only.

The server runs as a non-root user (PostgreSQL refuses to run as root): the current user when
that is not root, else the `postgres` system user the Debian/Ubuntu packages create, else
`nobody`. It listens on 127.0.0.1 on a free port with its unix socket in its own temp dir,
trusts local connections (nothing else can reach it) and trades durability for speed
(fsync off), which a test database never needs. Each test gets a fresh database.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

from tests.support.ports import free_port

PG_MAJOR = 15
SUPERUSER = "trainctl"
# Where Debian/Ubuntu's postgresql-15 package puts the server binaries (not on PATH).
BIN_DIRS = [Path(f"/usr/lib/postgresql/{PG_MAJOR}/bin"), Path("/usr/local/pgsql/bin")]
# Settings for a disposable server: nothing it holds must survive a crash.
SERVER_OPTIONS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",  # service + several workers, each with a connection pool
}


class PostgresUnavailable(RuntimeError):
    """PostgreSQL cannot be started here; the message says what to install or change."""


def find_bin_dir() -> Path:
    """The folder holding initdb and pg_ctl."""
    candidates = [*BIN_DIRS]
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).parent)
    for folder in candidates:
        if (folder / "initdb").exists() and (folder / "pg_ctl").exists():
            return folder
    raise PostgresUnavailable(
        f"PostgreSQL {PG_MAJOR} server binaries (initdb, pg_ctl) not found in "
        f"{', '.join(map(str, BIN_DIRS))} or on PATH; install them "
        f"(apt-get install postgresql-{PG_MAJOR}) to run the PostgreSQL tests"
    )


def server_user() -> pwd.struct_passwd:
    """Who runs the server: we ourselves unless we are root, which PostgreSQL refuses."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise PostgresUnavailable(
        "running as root and neither a 'postgres' nor a 'nobody' user exists to run "
        "PostgreSQL as; create one (useradd --system postgres)"
    )


class PostgresServer:
    """One server; `create_database()` hands out fresh databases as SQLAlchemy URLs."""

    def __init__(self) -> None:
        self.bin_dir = find_bin_dir()
        self.user = server_user()
        self.port = free_port()
        # Not under pytest's tmp_path: its parents are private to root, and the server user
        # must be able to reach its data directory.
        self.root = Path(tempfile.mkdtemp(prefix="trainctl-pg-"))
        os.chown(self.root, self.user.pw_uid, self.user.pw_gid)
        self.data_dir, self.socket_dir = self.root / "data", self.root
        self.log_file = self.root / "server.log"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        as_user: dict[str, Any] = {}
        if os.geteuid() != self.user.pw_uid:
            as_user = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        env = {**os.environ, "LC_ALL": "C", "PGTZ": "UTC"}
        return subprocess.run(
            [str(self.bin_dir / args[0]), *args[1:]],
            cwd=self.root,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
            **as_user,
        )

    def _check(self, result: subprocess.CompletedProcess[str], what: str) -> None:
        if result.returncode == 0:
            return
        log = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
        output = "\n".join(text for text in (result.stdout, result.stderr, log) if text)
        raise PostgresUnavailable(f"{what} failed (exit {result.returncode}):\n{output}")

    def start(self) -> PostgresServer:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self._check(
            self._run(
                "initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust",
                "--encoding=UTF8", "--no-sync", "--no-instructions",
            ),
            "initdb",
        )  # fmt: skip
        self.start_server()

    def start_server(self) -> None:
        """Start the initialised server (again, after `stop_server`)."""
        options = [f"-c {name}={value}" for name, value in SERVER_OPTIONS.items()]
        options += [f"-p {self.port}", "-h 127.0.0.1", f"-k {self.socket_dir}"]
        self._check(
            self._run(
                "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t", "60",
                "-o", " ".join(options), "start",
            ),
            "pg_ctl start",
        )  # fmt: skip

    def stop_server(self) -> None:
        """Stop the server as an operator's restart does (fast: open sessions are ended),
        keeping its data for `start_server`."""
        self._check(
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop"),
            "pg_ctl stop",
        )

    def pause(self) -> None:
        """SIGSTOP the whole server, the postmaster first (it starts no backend then): its
        kernel still accepts connections and acknowledges what clients send, and nothing
        answers, as a frozen VM or a stalled disk looks to clients."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> None:
        for pid in self._processes():
            with contextlib.suppress(ProcessLookupError):  # a backend that ended meanwhile
                os.kill(pid, signum)

    def _processes(self) -> list[int]:
        """The postmaster, then every process it started (backends, checkpointer, ...)."""
        postmaster = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # it exited meanwhile
            if int(fields[1]) == postmaster:
                children.append(int(stat.parent.name))
        return [postmaster, *children]

    def stop(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            self.resume()  # a paused server would not hear pg_ctl
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _admin(self) -> psycopg.Connection[Any]:
        # Here, not at the top: tests/conftest.py imports this module, and the GPU machine's
        # python, which runs `pytest -m gpu` (bench/gpu.sh), has no PostgreSQL driver.
        import psycopg

        return psycopg.connect(
            host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres", autocommit=True
        )

    def create_database(self) -> str:
        name = f"test_{uuid.uuid4().hex[:12]}"
        with self._admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with self._admin() as conn:
            # FORCE: a test that failed may have left connections (a killed worker's) open.
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @contextmanager
    def database(self) -> Iterator[str]:
        url = self.create_database()
        try:
            yield url
        finally:
            self.drop_database(url)


@contextmanager
def running_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server.start()
    finally:
        server.stop()
