"""What a virtual cluster is told (``Options``): where the control plane is, the tokens, the
working directory, the time scale, the hosts and ports it binds and advertises; and the layout
that follows from them (each node's name, directory and advertised endpoints)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Options:
    control_plane_url: str
    gateway_token: str
    workdir: Path
    operator_token: str = ""  # needed when engines join (lifecycle changes) and to wait for agents
    time_scale: float = 1.0  # sim seconds per wall second
    payload_bytes: int = 64 * 1024  # bytes a block file really holds (see engine.py)
    bind_host: str = "127.0.0.1"  # where the publishers and HTTP endpoints listen
    advertise_host: str = "127.0.0.1"  # how agents reach them
    base_port: int = 0  # publishers on base_port + 2i, + 2i + 1; 0 picks free ports
    http_port: int = 0
    agent_listen_host: str = "127.0.0.1"
    agent_advertise: str = "127.0.0.1"  # host agents advertise for transfers; "{node}" allowed
    agent_base_port: int = 0  # agent transfer ports; 0 picks free ports
    record_flush_s: float = 1.0
    loop: bool = False  # start the workload again when it ends
    node_prefix: str = "vc-node"
    # One CSV line per served request (trace seconds, TTFT, engine, cached and prompt tokens):
    # what a measured run reads its TTFTs from. None: not written (a looping demo runs for hours).
    served_log: Path | None = None
    # Days of the trace before the replayed window imported as request history before the
    # replay starts (``history.py``; needs the operator token); 0: none.
    history_days: float = 0.0

    def node_name(self, i: int) -> str:
        return f"{self.node_prefix}-{i}"

    def node_dir(self, i: int) -> Path:
        return Path(self.workdir) / self.node_name(i)

    def advertised(self, endpoint: str) -> str:
        """``endpoint`` (bound on ``bind_host``) as agents reach it (on ``advertise_host``)."""
        return endpoint.replace(f"//{self.bind_host}:", f"//{self.advertise_host}:")
