"""Agent configuration from a TOML file, ``PREWARM_AGENT_*`` environment variables and flags.

Precedence: command-line flag > environment > TOML file > default. Every option has one name:
``report_interval_s`` is ``report_interval_s = 1.0`` in TOML, ``PREWARM_AGENT_REPORT_INTERVAL_S``
in the environment and ``--report-interval-s`` on the command line; options of the
``[transfer]`` table get a ``transfer_`` prefix in the environment and on the command line.
Engines come from ``[[engines]]`` tables, ``PREWARM_AGENT_ENGINES`` (a JSON list) or repeated
``--engine key=value,key=value`` flags. Any problem raises ``ConfigError`` with one sentence.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from nodeagent.tap import tenant_rule_error
from wire import protocol

ENV_PREFIX = "PREWARM_AGENT_"
_ENGINE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


class ConfigError(ValueError):
    """A configuration problem, described in one line."""


@dataclass
class EngineConfig:
    """One inference engine the agent watches."""

    engine_id: str
    kind: str = "vllm"
    kv_events: str = ""  # vLLM publisher endpoint, e.g. tcp://127.0.0.1:5557
    # connect: vLLM binds (its endpoint is tcp://*:P, ipc://...); a wildcard host is reached on
    # loopback. bind: vLLM connects (its endpoint names an address, tcp://127.0.0.1:P): bind it.
    kv_events_socket: str = "connect"
    replay: str = ""  # vLLM replay (ROUTER) endpoint, e.g. tcp://127.0.0.1:5558
    topic: str = ""  # ZMQ subscription prefix; "" takes every topic
    metrics_url: str = ""  # the engine's Prometheus /metrics
    model: str = ""
    block_size: int = 16
    bytes_per_block: int = 0
    kv_capacity_blocks: int = 0
    gpu_uuids: list[str] = field(default_factory=list)
    # The engine's OpenAI-compatible server (vLLM's api_server), e.g. http://127.0.0.1:8000: the
    # ``warmup`` executor sends it prefill-only requests.
    openai_url: str = ""
    served_model_name: str = ""  # the "model" of those requests; defaults to ``model``
    # This engine's KV peer endpoint (vLLM offloading connector's P2P tier side channel,
    # host:port): a warm-up on another engine may pull the prefix from here.
    kv_peer: str = ""
    # Warm-ups on this engine pull from the source's kv_peer (kv_transfer_params.remote_kv_source)
    # instead of recomputing the prefix.
    warmup_pull: bool = False
    warmup_timeout_s: float = 300.0
    # This engine's LMCache instance (its lmcache_instance_id, LMCACHE_LMCACHE_INSTANCE_ID).
    lmcache_instance_id: str = ""
    lmcache_location: str = "LocalCPUBackend"  # the tier LMCache copies land in and pins
    # host:port of this engine's request tap (an OpenAI-compatible port in front of openai_url
    # whose requests become request records); "" serves none.
    tap_listen: str = ""


@dataclass
class TransferConfig:
    """Agent-to-agent transfers."""

    # Transports this agent executes. tcp and nccl need ``listen``: without it they are off.
    transports: str = "tcp,nccl,lmcache,warmup,lmcache-mp"
    # host:port of the TCP transfer server (and the host of the nccl rendezvous). No default:
    # the operator names the private address peers reach; "" runs no server (docs/security.md).
    listen: str = ""
    advertise: str = ""  # host:port peers use; defaults to listen (hostname:port if a wildcard)
    rate_limit_bytes_per_s: int = 0  # 0 = unlimited
    chunk_bytes: int = 4 << 20
    hash_threads: int = 2
    connect_timeout_s: float = 10.0
    retries: int = 2  # extra attempts inside one job before it fails
    block_store: str = "memory"  # memory | files | pinned
    block_store_path: str = ""
    block_store_max_bytes: int = 8 << 30


@dataclass
class AgentConfig:
    """Everything the agent needs to run."""

    control_plane_url: str = ""
    enrolment_token: str = ""
    hostname: str = field(default_factory=socket.gethostname)
    labels: dict[str, str] = field(default_factory=dict)
    state_dir: str = ""
    report_interval_s: float = 1.0
    # A residency change is reported this soon after the previous report (changes meanwhile
    # coalesced): at most 1 / report_min_interval_s reports a second. report_interval_s or more
    # reports on the tick only.
    report_min_interval_s: float = 0.1
    heartbeat_interval_s: float = 15.0
    request_timeout_s: float = 10.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    spool_max_bytes: int = 64 << 20
    metrics_listen: str = "127.0.0.1:9464"  # "" disables /metrics
    gpu_source: str = "nvml"  # nvml | simulated | none
    gpu_sim_source: str = ""  # file path or http(s) URL for the simulated source
    jobs_transport: str = "websocket"  # websocket | long-poll | none
    long_poll_wait_s: int = 25
    engine_metrics_interval_s: float = 5.0
    # LMCache: the controller (lmcache.v1.api_server) and the coordinator (lmcache.v1.mp_coordinator)
    # the ``lmcache`` and ``lmcache-mp`` executors call; the lease renewal period.
    lmcache_controller_url: str = ""
    lmcache_coordinator_url: str = ""
    lmcache_renew_s: float = 60.0
    log_level: str = "INFO"
    # Where the request taps take a record's tenant: model (the request's model name), api-key
    # (a digest of its bearer key) or header:<Header-Name>.
    tap_tenant: str = "model"
    # How often a tap sends a prefix's token ids instead of its keys (per tenant, model and
    # prefix): a warm-up or LMCache copy waits for the next record that carries them.
    tap_token_ids_every_s: float = 10.0
    # On SIGTERM: how long running jobs get to end and send their results before the agent exits.
    stop_timeout_s: float = 5.0
    engines: list[EngineConfig] = field(default_factory=list)
    transfer: TransferConfig = field(default_factory=TransferConfig)

    @property
    def state_path(self) -> Path:
        return Path(self.state_dir)


_SCALARS = (str, int, float, bool)


def _scalar_fields(cls: type) -> dict[str, type]:
    hints = get_type_hints(cls)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(cls)
        if hints[f.name] in _SCALARS or hints[f.name] == dict[str, str]
    }


def _coerce(name: str, typ: Any, value: Any) -> Any:
    """Convert a TOML/env/flag value to the field's type, or raise ConfigError."""
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if typ is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError(value)
            return int(value)
        if typ is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        if typ is str:
            if not isinstance(value, str | int | float):
                raise ValueError(value)
            return str(value)
        if typ == dict[str, str]:
            if isinstance(value, str):
                value = dict(kv.split("=", 1) for kv in value.split(",") if kv)
            if not isinstance(value, Mapping):
                raise ValueError(value)
            return {str(k): str(v) for k, v in value.items()}
    except (ValueError, TypeError):
        kind = getattr(typ, "__name__", typ)
        raise ConfigError(f"{name}: {value!r} is not a valid {kind}") from None
    raise ConfigError(f"{name}: unsupported option type")


def _engine(raw: Any, where: str) -> EngineConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: an engine must be a table of key = value")
    known = {f.name: f for f in dataclasses.fields(EngineConfig)}
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown engine option {unknown[0]!r}")
    if "engine_id" not in raw:
        raise ConfigError(f"{where}: engine_id is required")
    hints = get_type_hints(EngineConfig)
    values: dict[str, Any] = {}
    for k, v in raw.items():
        if hints[k] == list[str]:
            if isinstance(v, str):
                v = [p for p in v.split(";") if p]
            if not isinstance(v, list) or not all(isinstance(p, str) for p in v):
                raise ConfigError(f"{where}.{k}: must be a list of strings")
            values[k] = v
        else:
            values[k] = _coerce(f"{where}.{k}", hints[k], v)
    return EngineConfig(**values)


def _engine_flag(text: str) -> dict[str, str]:
    pairs = [p for p in text.split(",") if p]
    if not all("=" in p for p in pairs):
        raise ConfigError(f"--engine {text!r}: expected key=value,key=value")
    return dict(p.split("=", 1) for p in pairs)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="prewarm-agent",
        description="Prewarm node agent: GPU memory, KV residency, reports and replication jobs.",
    )
    p.add_argument("--config", help="TOML configuration file")
    p.add_argument("--print-config", action="store_true", help="print the merged config and exit")
    for name in _scalar_fields(AgentConfig):
        p.add_argument(_flag(name), dest=name, default=None)
    for name in _scalar_fields(TransferConfig):
        p.add_argument(_flag("transfer_" + name), dest="transfer_" + name, default=None)
    p.add_argument(
        "--engine",
        action="append",
        default=None,
        help="engine_id=vllm-0,kv_events=tcp://127.0.0.1:5557,replay=...,block_size=16 (repeat)",
    )
    return p


def load_config(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> AgentConfig:
    """Merge defaults, TOML, environment and flags; validate; raise ConfigError on any problem."""
    env = os.environ if env is None else env
    args = build_parser().parse_args(argv)
    path = args.config or env.get(ENV_PREFIX + "CONFIG")
    data: dict[str, Any] = {}
    if path:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        except OSError as exc:
            raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None

    cfg = AgentConfig()
    top = _scalar_fields(AgentConfig)
    tr = _scalar_fields(TransferConfig)
    unknown = sorted(set(data) - set(top) - {"engines", "transfer"})
    if unknown:
        raise ConfigError(f"{path}: unknown option {unknown[0]!r}")
    transfer_table = data.get("transfer", {})
    if not isinstance(transfer_table, Mapping):
        raise ConfigError(f"{path}: [transfer] must be a table")
    unknown = sorted(set(transfer_table) - set(tr))
    if unknown:
        raise ConfigError(f"{path}: unknown transfer option {unknown[0]!r}")

    def pick(name: str, typ: Any, file_value: Any, env_name: str, flag_value: Any) -> Any:
        if flag_value is not None:
            return _coerce(_flag(name), typ, flag_value)
        if env_name in env:
            return _coerce(env_name, typ, env[env_name])
        if file_value is not None:
            return _coerce(name, typ, file_value)
        return None

    for name, typ in top.items():
        v = pick(name, typ, data.get(name), ENV_PREFIX + name.upper(), getattr(args, name))
        if v is not None:
            setattr(cfg, name, v)
    for name, typ in tr.items():
        v = pick(
            "transfer_" + name,
            typ,
            transfer_table.get(name),
            ENV_PREFIX + "TRANSFER_" + name.upper(),
            getattr(args, "transfer_" + name),
        )
        if v is not None:
            setattr(cfg.transfer, name, v)

    if args.engine:
        cfg.engines = [
            _engine(_engine_flag(t), f"--engine #{i + 1}") for i, t in enumerate(args.engine)
        ]
    elif ENV_PREFIX + "ENGINES" in env:
        try:
            raw = json.loads(env[ENV_PREFIX + "ENGINES"])
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{ENV_PREFIX}ENGINES is not valid JSON: {exc.msg}") from None
        if not isinstance(raw, list):
            raise ConfigError(f"{ENV_PREFIX}ENGINES must be a JSON list of engine objects")
        cfg.engines = [_engine(e, f"{ENV_PREFIX}ENGINES[{i}]") for i, e in enumerate(raw)]
    elif "engines" in data:
        if not isinstance(data["engines"], list):
            raise ConfigError(f"{path}: engines must be an array of tables ([[engines]])")
        cfg.engines = [_engine(e, f"engines[{i}]") for i, e in enumerate(data["engines"])]

    validate(cfg)
    return cfg


TRANSPORTS = (
    protocol.TRANSPORT_TCP,
    protocol.TRANSPORT_NCCL,
    protocol.TRANSPORT_LMCACHE,
    protocol.TRANSPORT_WARMUP,
    protocol.TRANSPORT_LMCACHE_MP,
)
# agent to agent: a peer connects to an address of this agent
NEEDS_LISTEN = (protocol.TRANSPORT_TCP, protocol.TRANSPORT_NCCL)
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]", "*")


def transport_names(t: TransferConfig) -> list[str]:
    return [n.strip() for n in t.transports.split(",") if n.strip()]


def enabled_transports(t: TransferConfig) -> list[str]:
    """The configured transports that can run: tcp and nccl only with a listen address."""
    return [n for n in transport_names(t) if t.listen or n not in NEEDS_LISTEN]


def listens_everywhere(t: TransferConfig) -> bool:
    return bool(t.listen) and t.listen.rpartition(":")[0] in WILDCARD_HOSTS


def _host_port(name: str, value: str) -> None:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{name}: {value!r} is not host:port")


def validate(cfg: AgentConfig) -> None:
    """Check cross-field rules; raise ConfigError with the first problem found."""
    _validate_agent(cfg)
    _validate_transfer(cfg.transfer)
    for i, e in enumerate(cfg.engines):
        if any(seen.engine_id == e.engine_id for seen in cfg.engines[:i]):
            raise ConfigError(f"engine_id {e.engine_id!r} appears twice")
        _validate_engine(e)
    for name in ("lmcache_controller_url", "lmcache_coordinator_url"):
        url = getattr(cfg, name)
        if url and not url.startswith(("http://", "https://")):
            raise ConfigError(f"{name} {url!r} must start with http(s)://")
    if why := tenant_rule_error(cfg.tap_tenant):
        raise ConfigError(why)
    if cfg.tap_token_ids_every_s <= 0:
        raise ConfigError("tap_token_ids_every_s must be positive")
    if cfg.lmcache_renew_s <= 0:
        raise ConfigError("lmcache_renew_s must be positive")


def _validate_agent(cfg: AgentConfig) -> None:
    """The control plane, the state directory, the intervals and the sources."""
    if not cfg.control_plane_url:
        raise ConfigError(
            f"control_plane_url is required (--control-plane-url or {ENV_PREFIX}CONTROL_PLANE_URL)"
        )
    if not cfg.control_plane_url.startswith(("http://", "https://")):
        raise ConfigError(f"control_plane_url {cfg.control_plane_url!r} must start with http(s)://")
    if not cfg.state_dir:
        raise ConfigError(f"state_dir is required (--state-dir or {ENV_PREFIX}STATE_DIR)")
    for name in (
        "report_interval_s",
        "report_min_interval_s",
        "heartbeat_interval_s",
        "request_timeout_s",
        "backoff_initial_s",
        "backoff_max_s",
        "engine_metrics_interval_s",
        "stop_timeout_s",
    ):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"{name} must be positive")
    if cfg.spool_max_bytes < 4096:
        raise ConfigError("spool_max_bytes must be at least 4096")
    if cfg.gpu_source not in ("nvml", "simulated", "none"):
        raise ConfigError(f"gpu_source {cfg.gpu_source!r} must be nvml, simulated or none")
    if cfg.gpu_source == "simulated" and not cfg.gpu_sim_source:
        raise ConfigError("gpu_source = simulated needs gpu_sim_source (a file path or URL)")
    if cfg.jobs_transport not in ("websocket", "long-poll", "none"):
        raise ConfigError(
            f"jobs_transport {cfg.jobs_transport!r} must be websocket, long-poll or none"
        )
    if cfg.metrics_listen:
        _host_port("metrics_listen", cfg.metrics_listen)


def _validate_transfer(t: TransferConfig) -> None:
    unknown = [n for n in transport_names(t) if n not in TRANSPORTS]
    if unknown:
        raise ConfigError(
            f"transfer.transports: {unknown[0]!r} is not one of {', '.join(TRANSPORTS)}"
        )
    if t.listen:
        _host_port("transfer.listen", t.listen)
    if t.advertise:
        _host_port("transfer.advertise", t.advertise)
    if t.rate_limit_bytes_per_s < 0 or t.chunk_bytes < 4096 or t.hash_threads < 1 or t.retries < 0:
        raise ConfigError(
            "transfer: rate limit >= 0, chunk_bytes >= 4096, hash_threads >= 1, retries >= 0"
        )
    if t.block_store not in ("memory", "files", "pinned"):
        raise ConfigError(f"transfer.block_store {t.block_store!r} must be memory, files or pinned")
    if t.block_store == "files" and not t.block_store_path:
        raise ConfigError("transfer.block_store = files needs transfer.block_store_path")


def _validate_engine(e: EngineConfig) -> None:
    if not _ENGINE_ID.match(e.engine_id):
        raise ConfigError(f"engine_id {e.engine_id!r} must be 1-64 of letters, digits, _.:-")
    if e.kind != "vllm":
        raise ConfigError(f"engine {e.engine_id}: kind {e.kind!r} is not supported (vllm)")
    if not e.kv_events.startswith(("tcp://", "ipc://", "inproc://")):
        raise ConfigError(f"engine {e.engine_id}: kv_events must be a ZMQ endpoint (tcp://...)")
    if e.kv_events_socket not in ("connect", "bind"):
        raise ConfigError(
            f"engine {e.engine_id}: kv_events_socket {e.kv_events_socket!r} must be connect "
            "(vLLM binds: tcp://*:P) or bind (vLLM connects: tcp://host:P)"
        )
    if e.replay and not e.replay.startswith(("tcp://", "ipc://", "inproc://")):
        raise ConfigError(f"engine {e.engine_id}: replay must be a ZMQ endpoint (tcp://...)")
    if e.block_size <= 0 or e.bytes_per_block < 0 or e.kv_capacity_blocks < 0:
        raise ConfigError(f"engine {e.engine_id}: block_size > 0, byte and block counts >= 0")
    if e.openai_url and not e.openai_url.startswith(("http://", "https://")):
        raise ConfigError(f"engine {e.engine_id}: openai_url must start with http(s)://")
    if e.kv_peer:
        _host_port(f"engine {e.engine_id}: kv_peer", e.kv_peer)
    if e.tap_listen:
        _host_port(f"engine {e.engine_id}: tap_listen", e.tap_listen)
        if not e.openai_url:
            raise ConfigError(
                f"engine {e.engine_id}: tap_listen needs openai_url (the engine the tap fronts)"
            )
    if e.warmup_timeout_s <= 0:
        raise ConfigError(f"engine {e.engine_id}: warmup_timeout_s must be positive")
