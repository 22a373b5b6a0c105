"""A job's events reach the control plane in the order they happened, even over a channel whose
sends can overtake each other (long-poll posts each event on its own request): every progress
report in order, the result after the last of them."""

import asyncio
import time

from nodeagent.blockstore import MemoryBlockStore
from nodeagent.jobs import JobRunner, Journal
from nodeagent.transfers.base import TransferResult
from tests.agent.test_job_assign import full
from wire import protocol

STEPS = 6


class SteppedReceiver:
    """A transport whose receive reports progress block by block, then succeeds."""

    name = protocol.TRANSPORT_TCP

    def receive(self, job, store, progress):
        for n in range(1, STEPS + 1):
            progress(n)
        return TransferResult(True, bytes=STEPS, checksum="c")

    def send(self, job, store, progress):  # pragma: no cover - the target side only here
        raise AssertionError("not the source")


async def next_turn() -> None:
    """Resume on the event loop's next iteration (other ready tasks run first)."""
    loop = asyncio.get_running_loop()
    turn = loop.create_future()
    loop.call_soon(turn.set_result, None)
    await turn


async def test_progress_in_order_and_result_last_when_sends_overtake(tmp_path):
    runner = JobRunner(
        Journal(tmp_path / "journal"),
        MemoryBlockStore(1),
        {protocol.TRANSPORT_TCP: SteppedReceiver()},
    )
    arrived: list[dict] = []

    async def send(msg):
        # Earlier progress reports take longer to arrive, as concurrent posts can: each waits
        # more turns of the event loop than the one after it (no wall-clock time involved).
        if msg["type"] == protocol.MSG_JOB_PROGRESS:
            for _ in range(STEPS - msg["bytes_done"]):
                await next_turn()
        arrived.append(msg)

    msg = full(
        action=protocol.ACTION_REPLICATE,
        role=protocol.ROLE_TARGET,
        transport=protocol.TRANSPORT_TCP,
        deadline=time.time() + 60,
    )
    job_id = msg["job"]["id"]
    await runner.handle(msg, send)
    await asyncio.wait_for(runner.running[job_id], 30)
    kinds = [m["type"] for m in arrived]
    assert kinds[0] == protocol.MSG_JOB_ACK and kinds[-1] == protocol.MSG_JOB_RESULT
    assert [m["bytes_done"] for m in arrived if m["type"] == protocol.MSG_JOB_PROGRESS] == list(
        range(1, STEPS + 1)
    )
    assert arrived[-1]["state"] == protocol.JOB_SUCCEEDED
