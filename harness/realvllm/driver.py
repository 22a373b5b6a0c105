"""A request driver that acts as the gateway in front of real vLLM engines.

It replays a slice of the Mooncake conversation trace (``../shared/data/traces/mooncake``: arrival
times, prompt lengths and one hash id per 512-token block, equal ids meaning an identical
prefix; read with the simulator's loader) as token-id prompts for the tiny model: each full
Mooncake block becomes one 32-token vLLM block whose token ids are drawn from its hash id, so
the trace's prefix sharing becomes vLLM's block sharing exactly; each request's own tail is
divided by 16 too; prompts are capped to fit the 2048-token model.

With ``--router URL`` it is a load generator only: every request goes to that router (vllm-router
in front of the agents' request taps, ``router.py``), which picks the engine, and the taps post
the request records; each request names its tenant in the ``X-Prewarm-Tenant`` header, which the
taps read (``tap_tenant = "header:X-Prewarm-Tenant"``).

Without a router it is also the gateway: each request is routed like a cache-aware gateway
would, to the engine holding the longest prefix of the prompt according to the control plane's
residency lookup, least busy first, and to the least busy engine when none holds any of it. The
engine's answer gives the request record the driver posts to ``/api/request-records/`` (through
the harness's one gateway client, ``harness/gateway.py``): served engine, prompt tokens,
``usage.prompt_tokens_details.cached_tokens`` and the time to the first token it measured.
Engines that join mid-run follow the harness's one lifecycle scheduler (``harness/lifecycle.py``).

Pure Python (httpx), no Django: ``python -m harness.realvllm.driver --help``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading

import httpx

from harness.lifecycle import Lifecycles, Operator
from harness.realvllm.presets import REAL_PRESETS, TENANTS, add_preset_argument
from harness.realvllm.replay_gateway import (  # noqa: F401 - re-exported
    ENGINE_FIELD,
    TENANT_HEADER,
    DriverStats,
    Gateway,
    Target,
)
from harness.realvllm.traces import (  # noqa: F401 - the driver's workloads, re-exported
    BLOCK,
    MAX_PROMPT,
    TENANT,
    TraceRequest,
    block_tokens,
    mooncake,
    mooncake_path,
    prompt_of,
    servegen,
)

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s driver %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per request
    if args.router and args.engine:
        p.error("--router routes every request: no --engine with it")
    if not args.router and not (args.engine and args.gateway_token):
        p.error("without --router: --engine (one or more) and --gateway-token")
    if args.tenants < 1:
        p.error(f"--tenants {args.tenants}: at least 1")
    targets = _targets(p, args)
    try:
        if args.trace == "mooncake":
            requests = mooncake(None, args.start_s, args.duration_s)
        else:
            requests = REAL_PRESETS[args.preset].requests(
                tenants=args.tenants, duration_s=args.duration_s, rate=args.rate
            )
            args.speed = 1.0
    except (OSError, ValueError) as exc:
        print(f"driver: {exc}", file=sys.stderr)
        return 2
    gw = Gateway(args.control_plane, args.gateway_token, targets, post_records=not args.router)
    stop = threading.Event()
    if args.join:
        joins = _joins(p, args, gw)
        try:
            joiner = Lifecycles(
                Operator(args.control_plane, args.operator_token),
                "request driver",
                on_change=gw.set_serving,
            )
            if not joiner.find(set(joins)):
                raise ValueError(f"engines {', '.join(sorted(joins))} are not all known")
            joiner.hold(joins)
        except (ValueError, RuntimeError, httpx.HTTPError) as exc:
            print(f"driver: {exc}", file=sys.stderr)
            return 2
        threading.Thread(target=joiner.run, args=(joins, stop), daemon=True).start()
    print(
        f"driver: {len(requests)} requests of {args.trace} over "
        f"{requests[-1].at_s / args.speed if requests else 0:.0f} s",
        flush=True,
    )
    reporter = threading.Thread(target=_report_every, args=(gw, stop, 30.0), daemon=True)
    reporter.start()
    try:
        gw.replay(requests, speed=args.speed, loop=args.loop, stop=stop)
    except KeyboardInterrupt:
        stop.set()
        gw.flush()
    print(f"driver: {json.dumps(gw.summary())}", flush=True)
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Replay a Mooncake slice against real vLLM engines "
        "and post request records as a gateway."
    )
    p.add_argument("--control-plane", required=True)
    p.add_argument("--gateway-token", default="", help="without --router: posts the records")
    p.add_argument(
        "--router",
        default="",
        help="http://host:port of a router in front of the agents' request taps: every "
        "request goes there and the taps post the records (a load generator only)",
    )
    p.add_argument(
        "--engine",
        action="append",
        default=[],
        help="NODE/ENGINE_ID=http://127.0.0.1:PORT (repeat; the node as its agent's "
        "hostname, so that records name the engine that served them)",
    )
    p.add_argument("--trace", choices=("servegen", "mooncake"), default="servegen")
    add_preset_argument(
        p, "real", "the engines' model and, for servegen, the prompts' shape (presets.py)"
    )
    p.add_argument(
        "--rate",
        type=float,
        default=1.0,
        help="servegen: mean requests per wall second (10 trace seconds per second)",
    )
    p.add_argument(
        "--tenants",
        type=int,
        default=TENANTS,
        help=f"servegen: the busiest tenants replayed (default {TENANTS})",
    )
    p.add_argument("--start-s", type=float, default=0.0, help="mooncake: slice start")
    p.add_argument("--duration-s", type=float, default=1800.0, help="trace seconds replayed")
    p.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="mooncake: trace seconds per wall second (servegen is timed already)",
    )
    p.add_argument("--loop", action="store_true")
    p.add_argument(
        "--join",
        action="append",
        default=[],
        help="ENGINE_ID=ANNOUNCE_S:SERVE_S: the engine serves only from SERVE_S, "
        "announced warming at ANNOUNCE_S (needs --operator-token; with --router the "
        "announcements only: whoever runs the router adds the engine to it)",
    )
    p.add_argument("--operator-token", default="", help="an operator's user token (for --join)")
    return p


def _targets(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[Target]:
    """The router, or each ``--engine`` (its node the agent's hostname)."""
    model = REAL_PRESETS[args.preset].model.served_name
    targets = [Target("router", args.router, model=model)] if args.router else []
    for spec in args.engine:
        ref, sep, url = spec.partition("=")
        node, _, engine_id = ref.rpartition("/")
        if not sep or not url.startswith("http") or not engine_id:
            p.error(f"--engine {spec!r}: expected NODE/ENGINE_ID=http://host:port")
        targets.append(Target(engine_id, url, model=model, node=node))
    return targets


def _joins(
    p: argparse.ArgumentParser, args: argparse.Namespace, gw: Gateway
) -> dict[str, tuple[float, float]]:
    """``--join``: each joining engine's (announce, serve) seconds."""
    if not args.operator_token:
        p.error("--join needs --operator-token")
    joins = {}
    for spec in args.join:
        engine_id, _, times = spec.partition("=")
        try:
            announce, serve = (float(x) for x in times.split(":"))
        except ValueError:
            p.error(f"--join {spec!r}: expected ENGINE_ID=ANNOUNCE_S:SERVE_S")
        if (engine_id not in gw.targets and not args.router) or not 0 <= announce <= serve:
            p.error(f"--join {spec!r}: an --engine, and 0 <= ANNOUNCE_S <= SERVE_S")
        joins[engine_id] = (announce, serve)
    return joins


def _report_every(gw: Gateway, stop: threading.Event, every_s: float) -> None:
    while not stop.wait(every_s):
        log.info("%s", json.dumps(gw.summary()))


if __name__ == "__main__":
    sys.exit(main())
