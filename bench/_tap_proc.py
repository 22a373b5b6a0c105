"""The agent's tap as the benchmark runs it, in a process of its own: ``RequestTap`` on its
thread, ``RecordSpool`` on the main loop posting batches every second to ``--records-url`` (a
control plane's records endpoint; the stub's here), as the agent does. Prints its address, and
the records posted when it gets SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nodeagent.records import RecordSpool  # noqa: E402
from nodeagent.tap import RequestTap, TapThread  # noqa: E402


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--listen", required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--records-url", required=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spool = RecordSpool(args.records_url, Path(tmp), lambda: "bench", lambda: True)
        first: list[float] = []  # process CPU time at the first record: start-up left out

        def emit(record: dict) -> None:
            if not first:
                first.append(time.process_time())
            spool.add(record)

        tap = RequestTap("bench/vllm-0", args.listen, args.upstream, emit, 32)
        thread = TapThread([tap])
        thread.start()
        print(tap.address, flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        runner = asyncio.create_task(spool.run())
        await stop.wait()
        thread.stop()
        await spool.cut()
        await spool.flush()
        spool.stop_event.set()
        await runner
        await spool.aclose()
        cpu = time.process_time() - (first[0] if first else 0.0)
        print(
            f"observed={tap.observed} posted={spool.posted} cpu_s={cpu:.2f} "
            f"cpu_ms_per_request={cpu / max(tap.observed - 1, 1) * 1e3:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    asyncio.run(main())
