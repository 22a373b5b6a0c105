"""What makes vllm-router's kv_aware view of the engines' caches agree with the engines.

Two real vLLM engines (CPU, tiny model) publish their KV events; vllm-router (kv_aware) is
started in front of them with each setting in turn. Engine B alone is warmed with a prefix
(directly, not through the router); then the same prefix with other tails goes through the
router, as token ids and as text. Printed per setting: where the router sent each request and
the cached prefix it credited (its own log), and what the engine reported cached.

    PYTHONPATH=$PWD .venv/bin/python experiments/vllm-router-kv-aware/probe.py

About 4 minutes (the engines start twice: once per topic).
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from harness.realvllm.engine import VllmEngine, ensure_model, words
from harness.realvllm.router import RouterWorker, VllmRouter

SETTINGS = [  # (label, engine topic, engine --enable-scale-out, router --kv-event-block-size)
    ("topic 'kv', block size 16 (router default)", "kv", False, 16),
    ("topic 'kv', block size 32", "kv", False, 32),
    ("topic '', block size 32, no render routes", "", False, 32),
    ("topic '', block size 32, render routes", "", True, 32),
]


class Engine(VllmEngine):
    scale_out = True

    def argv(self) -> list[str]:
        argv = super().argv()
        return argv if self.scale_out else [a for a in argv if a != "--enable-scale-out"]


class Router(VllmRouter):
    def __init__(self, *args, block_size: int, **kw):
        super().__init__(*args, **kw)
        self.block_size = block_size


def cached(answer: dict) -> int:
    return int((answer["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def main() -> int:
    ensure_model()
    work = Path(tempfile.mkdtemp(prefix="router-probe-"))
    rng = random.Random(0)
    out = []
    engines: list[Engine] = []
    try:
        for topic in ("kv", ""):
            for e in engines:
                e.stop()
            engines = [
                Engine(f"{n}-{topic or 'empty'}", work, events="bind", cpu_cores=c, topic=topic)
                for n, c in (("a", "0"), ("b", "1" if (os.cpu_count() or 1) > 1 else "0"))
            ]
            for scale_out in (False, True):
                if not any(so == scale_out and t == topic for _, t, so, _ in SETTINGS):
                    continue
                for e in engines:
                    e.stop()
                    e.scale_out = scale_out
                    e.start()
                for e in engines:
                    e.wait_ready()
                for label, t, so, block in SETTINGS:
                    if t != topic or so != scale_out:
                        continue
                    prefix = [rng.randrange(4, 2048) for _ in range(320)]
                    engines[1].complete(prefix + [5] * 7)  # B alone holds it
                    time.sleep(0.5)
                    router = Router(
                        work,
                        [RouterWorker.of(e) for e in engines],
                        name=str(len(out)),
                        block_size=block,
                    )
                    router.start().wait_ready(60)
                    try:
                        rows = []
                        for kind in ("ids", "ids", "text"):
                            tail = [rng.randrange(4, 2048) for _ in range(9)]
                            prompt = prefix + tail if kind == "ids" else words(prefix + tail)
                            answer = router.complete(prompt)
                            time.sleep(0.2)
                            d = router.decisions()[-1]
                            where = "B" if d.worker == engines[1].url else "A"
                            rows.append(
                                f"{kind}: {d.outcome} -> {where}, credited {d.credited_tokens}, "
                                f"engine cached {cached(answer)}"
                            )
                    finally:
                        router.stop()
                    out.append({"setting": label, "requests": rows})
                    print(label, *rows, sep="\n  ", flush=True)
    finally:
        for e in engines:
            e.stop()
    print(json.dumps({"load": os.getloadavg(), "results": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
