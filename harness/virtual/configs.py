"""One agent configuration (TOML) per virtual node: its engine's KV-event sockets, its
``/metrics`` and OpenAI endpoints on the cluster's HTTP server, its block store for transfers and
its simulated GPUs."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING

from controlplane.sim.workloads.base import BLOCK_TOKENS

if TYPE_CHECKING:
    from controlplane.sim.config import ClusterConfig
    from harness.virtual.engine import VirtualEngine
    from harness.virtual.options import Options


def write_agent_configs(
    opt: Options,
    engines: list[VirtualEngine],
    http_port: int,
    config: ClusterConfig,
    model: str,
    block_bytes: int,
    enrolment_tokens: list[str] | None = None,
) -> list[Path]:
    """Write one agent TOML per node (each engine's, its endpoints on the cluster's HTTP server
    at ``http_port``) and return their paths. With ``enrolment_tokens`` each file carries its
    node's token (mode 0600); otherwise the agent's environment must."""
    paths = []
    http = f"http://{opt.advertise_host}:{http_port}"
    cost = config.cost
    for ve in engines:
        i = ve.sim.eid
        node = opt.node_name(i)
        if opt.agent_base_port:
            port = opt.agent_base_port + i
        else:
            with socket.socket() as s:
                s.bind((opt.agent_listen_host, 0))
                port = s.getsockname()[1]
        adv = opt.agent_advertise.replace("{node}", node)
        uuids = [f"GPU-{node}-{g}" for g in range(cost.gpus)]
        text = "\n".join(
            [
                f'control_plane_url = "{opt.control_plane_url}"',
                f'hostname = "{node}"',
                *(
                    [f'enrolment_token = "{enrolment_tokens[i]}"']
                    if enrolment_tokens and i < len(enrolment_tokens)
                    else []
                ),
                f'state_dir = "{opt.node_dir(i) / "state"}"',
                'labels = { virtual = "true" }',
                "report_interval_s = 1.0",
                "engine_metrics_interval_s = 2.0",
                'metrics_listen = ""',
                'gpu_source = "simulated"',
                f'gpu_sim_source = "{http}/nodes/{node}/gpus"',
                "",
                "[transfer]",
                f'listen = "{opt.agent_listen_host}:{port}"',
                f'advertise = "{adv}:{port}"',
                'block_store = "files"',
                f'block_store_path = "{ve.store}"',
                "",
                "[[engines]]",
                f'engine_id = "{ve.engine_id}"',
                f'kv_events = "{opt.advertised(ve.publisher.endpoint)}"',
                f'replay = "{opt.advertised(ve.publisher.replay_endpoint)}"',
                'topic = "kv"',
                f'metrics_url = "{http}/engines/{ve.engine_id}/metrics"',
                f'openai_url = "{http}/engines/{ve.engine_id}"',
                f'model = "{model}"',
                f"block_size = {BLOCK_TOKENS}",
                f"bytes_per_block = {block_bytes}",
                f"kv_capacity_blocks = {config.kv_capacity_blocks}",
                f"gpu_uuids = [{', '.join(repr(u).replace(chr(39), chr(34)) for u in uuids)}]",
                "",
            ]
        )
        path = opt.node_dir(i) / "agent.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(text)
        paths.append(path)
    return paths
