"""Starting and stopping the processes the demo, the tests and the benchmarks run: one child
with its own log (``Proc``), the control plane's command lines (``daphne``, ``celery_worker``,
``celery_beat``), a free loopback port, waiting for a condition or a health endpoint, and the
PostgreSQL database a run uses (created when missing, said in one line when the server does not
answer).

Every child process of the demo, the tests and the benchmarks is a ``Proc``: the demo's run of
several children (``launch.Children``), the real control plane of the tests and benchmarks
(``live.LiveControlPlane``), the end-to-end cluster, the virtual cluster's agents, the real
engines and router (``realvllm.engine.ServerProcess``), the LMCache fixtures and the benches'
workers and helpers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from wire.protocol import SOCKET_MESSAGE_MAX_BYTES

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    """``predicate()``'s first truthy value, polled until ``timeout`` (then AssertionError)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def manage(env: dict[str, str], *args: str) -> str:
    """``manage.py ARGS`` in ``env``; its stdout, or RuntimeError with the end of its stderr."""
    out = subprocess.run(
        [sys.executable, str(REPO / "manage.py"), *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise RuntimeError(f"manage.py {args[0]} failed: {out.stderr[-2000:]}")
    return out.stdout


# -- the control plane's processes, as the containers run them ----------------------------------
def daphne_argv(host: str, port: int, prefix: list[str] | None = None) -> list[str]:
    """The web process: daphne serving ``controlplane.asgi`` on ``host:port``, with the agents'
    socket message limit (as ``docker/Dockerfile.controlplane`` runs it). ``prefix``: the command
    that starts daphne (a benchmark's profiler wraps it); its arguments follow."""
    return [
        *(prefix or [sys.executable, "-m", "daphne"]),
        *("-b", host, "-p", str(port)),
        *("--websocket-max-message-size", str(SOCKET_MESSAGE_MAX_BYTES)),
        "controlplane.asgi:application",
    ]


def celery_worker_argv(
    queues: str, concurrency: int, name: str = "", loglevel: str = "INFO", *extra: str
) -> list[str]:
    """A Celery worker consuming ``queues`` (comma-separated) with ``concurrency`` pool
    processes; ``name``: its node name (``-n``); ``extra``: more worker options."""
    argv = [sys.executable, "-m", "celery", "-A", "controlplane.celery", "worker"]
    argv += ["-Q", queues, "-c", str(concurrency), "-l", loglevel]
    return argv + (["-n", name] if name else []) + list(extra)


def celery_beat_argv(schedule: Path, loglevel: str = "WARNING") -> list[str]:
    """Celery beat, keeping its schedule in ``schedule``."""
    argv = [sys.executable, "-m", "celery", "-A", "controlplane.celery", "beat"]
    return argv + ["-l", loglevel, "-s", str(schedule)]


class Proc:
    """One child process with its own log; restartable, stoppable, killable by signal.

    ``log_dir``: its output goes to ``<log_dir>/<name>.log`` (``log_path`` names another file;
    neither: it shares this process's stdout and stderr). ``session``: it leads a process group
    of its own, and signals go to the whole group (a worker's pool children, an engine's core
    and workers die with it); without, it stays in this process's group (a terminal's Ctrl-C
    reaches it) and signals go to it alone. ``pipe``: its stdin and stdout are pipes to this
    process (a helper that answers requests line by line, or prints its address first); its
    stderr goes to the log. ``pass_fds``: descriptors it inherits (the demo's run lock).
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        log_dir: Path | None = None,
        stop_timeout_s: float = 15.0,
        *,
        log_path: Path | None = None,
        session: bool = True,
        pipe: bool = False,
        pass_fds: tuple[int, ...] = (),
    ):
        self.name, self.argv, self.env = name, argv, env
        self.log_path = log_path or (log_dir / f"{name}.log" if log_dir is not None else None)
        self.stop_timeout_s = stop_timeout_s
        self.session, self.pipe, self.pass_fds = session, pipe, pass_fds
        self.p: subprocess.Popen | None = None

    def start(self) -> Proc:
        log = open(self.log_path, "ab") if self.log_path else None  # noqa: SIM115
        try:
            self.p = subprocess.Popen(  # the one place a child process is started
                self.argv,
                env=self.env,
                cwd=REPO,
                stdin=subprocess.PIPE if self.pipe else subprocess.DEVNULL,
                stdout=subprocess.PIPE if self.pipe else log,
                stderr=log if self.pipe else (subprocess.STDOUT if log else None),
                text=self.pipe,
                start_new_session=self.session,
                pass_fds=self.pass_fds,
            )
        finally:
            if log:
                log.close()  # the child has its own descriptor
        return self

    @property
    def pid(self) -> int:
        assert self.p is not None, f"{self.name}: start() first"
        return self.p.pid

    @property
    def returncode(self) -> int | None:
        return None if self.p is None else self.p.poll()

    @property
    def stdin(self):
        return self.p.stdin if self.p else None

    @property
    def stdout(self):
        return self.p.stdout if self.p else None

    def alive(self) -> bool:
        return self.p is not None and self.p.poll() is None

    def send(self, sig: int, group: bool | None = None) -> None:
        """Send ``sig`` to its group (``session``) or to it alone (``group=False``: the child
        stops its own children, as the virtual cluster stops its agents)."""
        if not self.alive():
            return
        assert self.p is not None
        try:
            if self.session if group is None else group:
                os.killpg(self.p.pid, sig)
            else:
                self.p.send_signal(sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; ``subprocess.TimeoutExpired`` past ``timeout``."""
        assert self.p is not None, f"{self.name}: start() first"
        return self.p.wait(timeout)

    def communicate(self, input: str | None = None, timeout: float | None = None) -> str:
        """With ``pipe``: send ``input``, close its stdin, read its stdout to the end, wait."""
        assert self.p is not None, f"{self.name}: start() first"
        return self.p.communicate(input, timeout)[0] or ""

    def readline(self) -> str:
        """With ``pipe``: the next line it writes (``""`` once it exited)."""
        assert self.p is not None and self.p.stdout is not None, f"{self.name}: pipe=True"
        return self.p.stdout.readline()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal it (its group with ``session``) and wait for it to exit."""
        if self.alive():
            self.send(sig)
            self.wait(self.stop_timeout_s)

    def stop(self, timeout_s: float | None = None, leader_first: bool = False) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s`` (default ``stop_timeout_s``).
        ``leader_first``: SIGTERM to the child alone, which stops its own children; whatever
        of its group is left when it has exited is killed."""
        if self.p is None:
            return
        if self.alive():
            self.send(signal.SIGTERM, group=False if leader_first else None)
            try:
                self.wait(self.stop_timeout_s if timeout_s is None else timeout_s)
            except subprocess.TimeoutExpired:
                self.send(signal.SIGKILL)
                self.wait()
        if leader_first and self.session:
            try:
                os.killpg(self.p.pid, signal.SIGKILL)  # what it started and did not stop
            except ProcessLookupError:
                pass

    def tail(self, n: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-n:]


def wait_healthy(url: str, proc: Proc, timeout_s: float, interval: float = 0.3) -> None:
    """Until ``url`` answers 200; RuntimeError at once when ``proc`` exits (with its log's
    end), TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited with code {proc.returncode}: {proc.tail(2000)}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(interval)
    raise TimeoutError(f"{proc.name} did not answer {url} within {timeout_s:.0f} s")


class DatabaseUnavailable(RuntimeError):
    """The PostgreSQL server a run needs does not answer (the message is one line)."""


def _admin_url(url: str) -> str:
    url = url.replace("postgres://", "postgresql://", 1)
    return urlsplit(url)._replace(path="/postgres").geturl()


def pg_admin(url: str, sql: str) -> None:
    """Run one statement on the maintenance database of the server ``url`` names."""
    import psycopg

    with psycopg.connect(_admin_url(url), autocommit=True) as conn:
        conn.execute(sql)


def ensure_database(url: str) -> bool:
    """Create the database ``url`` names when it does not exist; True when it was created."""
    import psycopg

    name = urlsplit(url).path.lstrip("/")
    try:
        with psycopg.connect(_admin_url(url), autocommit=True, connect_timeout=5) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                return False
            conn.execute(f'CREATE DATABASE "{name}"')
            return True
    except psycopg.OperationalError as exc:
        first = (str(exc).strip().splitlines() or ["no answer"])[0]
        host = urlsplit(url).hostname
        raise DatabaseUnavailable(f"PostgreSQL at {host} does not answer: {first}") from None
