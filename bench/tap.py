"""The request tap's overhead: the same requests sent straight to the engine and through the
tap, in alternating rounds of the same run, at a fixed open-loop rate.

Default: a stand-in engine (``harness.openai_stub``, its own process; 20 ms before
the first byte, three streamed tokens), because a CPU vLLM engine cannot serve 200 requests/s;
the tap in its own process (``bench/_tap_proc.py``: ``RequestTap`` on its thread, the record
spool posting every second to the stub's records endpoint, as in the agent); requests sent at
``--rate`` (200/s), half streamed, token-id prompts of 300 tokens from 20 prefixes. ``--vllm``
puts a real vLLM CPU engine (the tiny model) behind both arms instead, at ``--rate`` 10/s by
default (what it serves), one generated token.

Per arm: latency to the first body byte (TTFT as the client sees it) and to the last, p50 and
p99; throughput (completed/s); errors. Added = tap - direct. Prints the machine's load average
beside the figures: on a shared machine they are noisy.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from _common import REPO, parser, percentile, table, write_json

from harness.processes import Proc, free_port


def spawn(name: str, argv: list[str]) -> tuple[Proc, str]:
    """Start a helper process; its first stdout line is its address."""
    proc = Proc(name, argv, {**os.environ, "PYTHONPATH": str(REPO)}, pipe=True).start()
    line = proc.readline().strip()
    if not line:
        raise RuntimeError(f"{argv[:4]} did not start")
    return proc, line


async def one(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[float, float, bool]:
    t0 = time.perf_counter()
    async with session.post(url, json=body) as resp:
        first = None
        async for _ in resp.content.iter_any():
            if first is None:
                first = time.perf_counter() - t0
        ok = resp.status == 200
    return first if first is not None else math_nan(), time.perf_counter() - t0, ok


def math_nan() -> float:
    return float("nan")


async def round_(
    session: aiohttp.ClientSession, base: str, rate: float, seconds: float, bodies: list[dict]
) -> tuple[list[tuple[float, float, bool]], float]:
    """Open loop: one request every 1/rate s for ``seconds``; returns results and the wall
    time from the first send to the last answer."""
    n = int(rate * seconds)
    start = time.perf_counter()
    tasks = []
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        body = bodies[i % len(bodies)]
        tasks.append(asyncio.create_task(one(session, base + "/v1/completions", body)))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    wall = time.perf_counter() - start
    return [r if isinstance(r, tuple) else (math_nan(), math_nan(), False) for r in results], wall


def summary(results: list[tuple[float, float, bool]], wall: float) -> dict:
    ok = [r for r in results if r[2]]
    return {
        "requests": len(results),
        "errors": len(results) - len(ok),
        "ttft_p50_ms": percentile([r[0] * 1e3 for r in ok], 50),
        "ttft_p99_ms": percentile([r[0] * 1e3 for r in ok], 99),
        "total_p50_ms": percentile([r[1] * 1e3 for r in ok], 50),
        "total_p99_ms": percentile([r[1] * 1e3 for r in ok], 99),
        "throughput_rps": len(ok) / wall if wall else 0.0,
    }


def bodies_for(model: str, max_tokens: int, n: int = 40) -> list[dict]:
    rng = random.Random(7)
    prefixes = [[rng.randrange(4, 2048) for _ in range(256)] for _ in range(20)]
    out = []
    for i in range(n):
        prompt = prefixes[i % 20] + [rng.randrange(4, 2048) for _ in range(44)]
        out.append(
            {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": bool(i % 2)}
        )
    return out


async def run(args, direct: str, tap: str, model: str, max_tokens: int) -> dict:
    bodies = bodies_for(model, max_tokens)
    arms: dict[str, list] = {"direct": [], "tap": []}
    walls = {"direct": 0.0, "tap": 0.0}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=0)
    ) as session:
        # Warm both paths (connections, the engine's cache) outside the figures.
        await round_(session, direct, args.rate, 1.0, bodies)
        await round_(session, tap, args.rate, 1.0, bodies)
        for r in range(args.rounds):
            order = ("direct", "tap") if r % 2 == 0 else ("tap", "direct")
            for arm in order:
                got, wall = await round_(
                    session, direct if arm == "direct" else tap, args.rate, args.seconds, bodies
                )
                arms[arm] += got
                walls[arm] += wall
    return {arm: summary(arms[arm], walls[arm]) for arm in arms}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=None, help="requests/s (200; 10 with --vllm)")
    p.add_argument("--rounds", type=int, default=None, help="alternating rounds per arm")
    p.add_argument("--seconds", type=float, default=None, help="seconds per round")
    p.add_argument("--vllm", action="store_true", help="a real vLLM CPU engine behind both arms")
    args = p.parse_args()
    args.rate = args.rate or (10.0 if args.vllm else 200.0)
    args.rounds = args.rounds or (2 if args.quick else 6)
    args.seconds = args.seconds or (5.0 if args.quick else 10.0)
    py = sys.executable
    procs: list[Proc] = []
    engine = None
    try:
        if args.vllm:
            from harness.realvllm.engine import MODEL_NAME, VllmEngine

            engine = VllmEngine("bench", Path(tempfile.mkdtemp()), cpu_cores="0")
            engine.start().wait_ready()
            upstream, model, max_tokens, what = engine.url, MODEL_NAME, 1, "vLLM CPU (tiny model)"
            stub_proc, records_url = spawn(
                "stub", [py, "-m", "harness.openai_stub", "--port", str(free_port())]
            )
            procs.append(stub_proc)
        else:
            stub_proc, upstream = spawn(
                "stub",
                [
                    py,
                    "-m",
                    "harness.openai_stub",
                    "--port",
                    str(free_port()),
                    "--delay-s",
                    "0.02",
                ],
            )
            procs.append(stub_proc)
            records_url, model, max_tokens = upstream, "tiny", 3
            what = "stub engine (20 ms to first byte, 3 tokens)"
        tap_proc, tap_addr = spawn(
            "tap",
            [
                py,
                str(REPO / "bench/_tap_proc.py"),
                "--listen",
                f"127.0.0.1:{free_port()}",
                "--upstream",
                upstream,
                "--records-url",
                records_url,
            ],
        )
        procs.append(tap_proc)
        load_before = os.getloadavg()
        arms = asyncio.run(run(args, upstream, f"http://{tap_addr}", model, max_tokens))
        load_after = os.getloadavg()
        tap_proc.send(signal.SIGTERM)
        tail = tap_proc.communicate(timeout=30).strip().splitlines()
        procs.remove(tap_proc)
    finally:
        for proc in procs:
            proc.stop(10)
        if engine:
            engine.stop()
    d, t = arms["direct"], arms["tap"]
    added = {
        "ttft_p50_ms": t["ttft_p50_ms"] - d["ttft_p50_ms"],
        "ttft_p99_ms": t["ttft_p99_ms"] - d["ttft_p99_ms"],
        "total_p99_ms": t["total_p99_ms"] - d["total_p99_ms"],
        "throughput_loss_rps": d["throughput_rps"] - t["throughput_rps"],
    }
    rows = [
        (
            arm,
            str(s["requests"]),
            str(s["errors"]),
            f"{s['ttft_p50_ms']:.2f}",
            f"{s['ttft_p99_ms']:.2f}",
            f"{s['total_p99_ms']:.2f}",
            f"{s['throughput_rps']:.1f}",
        )
        for arm, s in arms.items()
    ]
    print(
        f"engine: {what}; rate {args.rate:g}/s; {args.rounds} rounds x {args.seconds:g} s per arm"
    )
    print(
        table(rows, ("arm", "requests", "errors", "ttft p50 ms", "ttft p99 ms", "p99 ms", "req/s"))
    )
    print(
        f"added by the tap: p50 {added['ttft_p50_ms']:+.2f} ms, p99 {added['ttft_p99_ms']:+.2f} ms "
        f"(to first byte), p99 {added['total_p99_ms']:+.2f} ms (to last byte); throughput "
        f"{-added['throughput_loss_rps']:+.1f} req/s"
    )
    print(f"tap: {tail[-1] if tail else '?'}")
    print(
        f"load average before {tuple(round(x, 2) for x in load_before)}, after "
        f"{tuple(round(x, 2) for x in load_after)} on {os.cpu_count()} cores (shared machine)"
    )
    write_json(
        args.json,
        {
            "engine": what,
            "rate": args.rate,
            "rounds": args.rounds,
            "seconds": args.seconds,
            "arms": arms,
            "added": added,
            "tap": tail[-1] if tail else "",
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "cpus": os.cpu_count(),
        },
    )


if __name__ == "__main__":
    main()
