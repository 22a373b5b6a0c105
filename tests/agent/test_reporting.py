"""Reports: deltas, snapshots, the spool through a control plane outage, stale seq, the bound."""

import asyncio
import time

import pytest

from nodeagent.engine_residency import EngineResidency
from nodeagent.kvevents import decode_payload
from nodeagent.reporter import Reporter
from tests.agent.conftest import load_messages


def make_reporter(cp, tmp_path, res, **kw):
    return Reporter(
        cp.url,
        tmp_path,
        {"vllm-0": res},
        lambda: [],
        lambda: [{"engine_id": "vllm-0"}],
        enrolment_token="enrol-1",
        hostname="node-a",
        interval_s=0.05,
        backoff_initial_s=0.05,
        backoff_max_s=0.5,
        timeout_s=1.0,
        **kw,
    )


def server_view(cp, node=1):
    return sorted(cp.residency.get((node, "vllm-0"), {}).values())


def agent_view(res):
    return sorted(res.take_entry(force_snapshot=True)["stored"])


async def outage(cp, tmp_path, down_s):
    frames, _ = load_messages("0.33.0")
    res = EngineResidency("vllm-0", 16)
    rep = make_reporter(cp, tmp_path, res)
    task = asyncio.create_task(rep.run())
    payloads = [p for _t, _s, p in frames]
    for p in payloads[:20]:
        res.apply_events(decode_payload(p)[1])
        await asyncio.sleep(0.02)
    assert cp.wait_for(lambda: len(cp.reports) >= 3, 30)
    cp.stop()
    end = time.monotonic() + down_s
    rest = payloads[20:]
    step = down_s / len(rest)
    for p in rest:  # the engine keeps working while the control plane is away
        res.apply_events(decode_payload(p)[1])
        await asyncio.sleep(step)
    await asyncio.sleep(max(0.0, end - time.monotonic()))
    spooled = len(rep.spool)
    cp.start()
    # Catching up is bounded by the push backoff (backoff_max_s) plus one push per spooled
    # report; the ceiling is for a loaded machine, a passing test waits a fraction of a second.
    deadline = time.monotonic() + 30
    while not (len(rep.spool) == 0 and rep.last_applied_seq == rep.state.seq):
        assert time.monotonic() < deadline, f"{len(rep.spool)} reports still spooled after 30 s"
        await asyncio.sleep(0.05)
    rep.stop_event.set()
    await task
    await rep.aclose()
    applied = [r["seq"] for r in cp.reports]
    assert spooled >= 10
    assert applied == list(range(1, rep.state.seq + 1))  # every report, in order
    assert server_view(cp) == agent_view(res)


async def test_control_plane_down_loses_no_report(control_plane, tmp_path):
    await outage(control_plane, tmp_path, down_s=2.0)


@pytest.mark.slow
async def test_control_plane_down_30s_loses_no_report(control_plane, tmp_path):
    await outage(control_plane, tmp_path, down_s=30.0)


async def test_first_report_is_a_snapshot_then_deltas(control_plane, tmp_path):
    frames, _ = load_messages("0.10.1")
    res = EngineResidency("vllm-0", 16)
    for _t, _s, p in frames[:5]:
        res.apply_events(decode_payload(p)[1])
    rep = make_reporter(control_plane, tmp_path, res)
    rep.build_report()
    assert await rep.flush()
    for _t, _s, p in frames[5:10]:
        res.apply_events(decode_payload(p)[1])
    rep.build_report()
    assert await rep.flush()
    modes = [r["residency"][0]["mode"] for r in control_plane.reports]
    assert modes == ["snapshot", "delta"]
    assert server_view(control_plane) == agent_view(res)
    await rep.aclose()


async def test_snapshot_requested_by_server(control_plane, tmp_path):
    res = EngineResidency("vllm-0", 16)
    rep = make_reporter(control_plane, tmp_path, res)
    rep.build_report()
    await rep.flush()
    control_plane.snapshot_requests[1] = ["vllm-0"]
    rep.build_report()
    await rep.flush()
    rep.build_report()
    await rep.flush()
    assert control_plane.reports[-1]["residency"][0]["mode"] == "snapshot"
    await rep.aclose()


async def test_stale_seq_drops_what_the_server_has(control_plane, tmp_path):
    res = EngineResidency("vllm-0", 16)
    rep = make_reporter(control_plane, tmp_path, res)
    rep.build_report()
    await rep.flush()
    control_plane.last_seq[1] = 50  # the server is ahead (agent state restored from backup)
    rep.build_report()
    await rep.flush()
    assert len(rep.spool) == 0 and rep.state.seq == 50 and rep.force_snapshot
    rep.build_report()
    await rep.flush()
    assert control_plane.reports[-1]["seq"] == 51
    assert control_plane.reports[-1]["residency"][0]["mode"] == "snapshot"
    await rep.aclose()


async def test_spool_bound_drops_and_forces_a_snapshot(control_plane, tmp_path):
    frames, _ = load_messages("0.33.0")
    res = EngineResidency("vllm-0", 16)
    rep = make_reporter(control_plane, tmp_path, res, spool_max_bytes=8192)
    control_plane.stop()
    for _t, _s, p in frames:
        res.apply_events(decode_payload(p)[1])
        rep.build_report()
    assert rep.spool.dropped_reports > 0
    control_plane.start()
    rep.retry_at = 0
    assert await rep.flush()
    assert server_view(control_plane) == agent_view(res)
    await rep.aclose()


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "misnamed", "empty"])
async def test_corrupted_or_truncated_spool_file_is_reported_and_skipped_on_start(
    control_plane, tmp_path, damage, caplog
):
    frames, _ = load_messages("0.33.0")
    res = EngineResidency("vllm-0", 16)
    rep = make_reporter(control_plane, tmp_path, res)
    control_plane.stop()  # the agent spools while the control plane is away, then stops
    for _t, _s, p in frames[:6]:
        res.apply_events(decode_payload(p)[1])
        rep.build_report()
    await rep.aclose()
    files = sorted((tmp_path / "spool").glob("*.rep"))
    assert len(files) == 6
    victim = files[2]
    data = victim.read_bytes()
    if damage == "truncate":
        victim.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        victim.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    elif damage == "garbage":
        victim.write_bytes(b"\x00not a report")
    elif damage == "misnamed":
        victim.rename(victim.with_name("junk.rep"))
    else:
        victim.write_bytes(b"")

    # Agent start: the bad file is logged and skipped, the good ones stay queued in order.
    res2 = EngineResidency("vllm-0", 16)
    for _t, _s, p in frames[:6]:
        res2.apply_events(decode_payload(p)[1])
    rep2 = make_reporter(control_plane, tmp_path, res2)
    assert rep2.spool.corrupt_reports == 1 and len(rep2.spool) == 5
    assert "skipped" in caplog.text
    control_plane.start()
    rep2.build_report()  # the first report after start is a snapshot: it repairs the lost deltas
    assert await rep2.flush()
    assert len(rep2.spool) == 0
    assert server_view(control_plane) == agent_view(res2)
    await rep2.aclose()


def test_a_spool_file_damaged_after_start_is_skipped_when_read(tmp_path):
    from nodeagent.spool import Spool

    spool = Spool(tmp_path, 1 << 20)
    spool.append(1, b"one")
    spool.append(2, b"two")
    (tmp_path / f"{1:020d}.rep").write_bytes(b"PWS1")
    assert spool.read(1) is None and spool.read(2) == b"two"
    assert spool.corrupt_reports == 1 and spool.seqs() == [2]


async def test_a_target_acknowledges_a_copy_after_spooling_what_its_engine_held(
    control_plane, tmp_path
):
    """The target's ack names the report holding every KV event seen before it (report_seq):
    the events before the ack are in that report or earlier, those after in later ones. A
    source's ack names none."""
    from nodeagent.blockstore import MemoryBlockStore
    from nodeagent.jobs import JobRunner, Journal
    from tests.agent.test_job_assign import full
    from wire import protocol

    frames, _ = load_messages("0.10.1")
    res = EngineResidency("vllm-0", 16)
    rep = make_reporter(control_plane, tmp_path, res)
    runner = JobRunner(Journal(tmp_path / "journal"), MemoryBlockStore(1), {}, cut_report=rep.cut)
    for _t, _s, p in frames[:5]:
        res.apply_events(decode_payload(p)[1])
    sent: list[dict] = []

    async def send(msg):
        sent.append(msg)

    deadline = time.time() + 600
    for i, role in enumerate((protocol.ROLE_TARGET, protocol.ROLE_SOURCE)):
        msg = full(job_id=f"6f1c0d5e-0000-4000-8000-00000000000{i}", role=role, deadline=deadline)
        await runner.handle(msg, send)
    acks = [m for m in sent if m["type"] == protocol.MSG_JOB_ACK]
    assert [a.get("report_seq") for a in acks] == [1, None]
    assert await rep.flush()  # sends the spooled report 1 only
    assert [r["seq"] for r in control_plane.reports] == [1]
    assert server_view(control_plane) == agent_view(res)  # every event before the ack
    for _t, _s, p in frames[5:10]:  # the engine's events after the ack
        res.apply_events(decode_payload(p)[1])
    rep.build_report()
    assert await rep.flush()
    assert [r["seq"] for r in control_plane.reports] == [1, 2]
    assert control_plane.reports[1]["residency"][0]["mode"] == "delta"
    await rep.aclose()


async def test_a_change_is_reported_before_the_tick_and_a_flood_is_coalesced(
    control_plane, tmp_path
):
    """Ticks every 30 s: a KV-event batch is reported within min_interval_s anyway; a batch
    every 2 ms for a second gives at most about 1 / min_interval_s reports, not 500."""
    frames, _ = load_messages("0.33.0")
    payloads = [p for _t, _s, p in frames]
    res = EngineResidency("vllm-0", 16)
    rep = make_reporter(control_plane, tmp_path, res)
    rep.interval_s, rep.min_interval_s = 30.0, 0.1
    task = asyncio.create_task(rep.run())
    await until(lambda: len(control_plane.reports) == 1, "the first report")
    res.apply_events(decode_payload(payloads[0])[1])
    t0 = time.monotonic()
    rep.poke()  # as the subscriber thread does after each batch
    await until(lambda: len(control_plane.reports) == 2, "the change (not the 30 s tick)")
    first = time.monotonic() - t0
    before = len(control_plane.reports)
    t0 = time.monotonic()
    for p in payloads[1:]:
        res.apply_events(decode_payload(p)[1])
        rep.poke()
        await asyncio.sleep(0.002)
    spent = time.monotonic() - t0
    await until(
        lambda: (
            not any(res.pending_stored.values())
            and not any(res.pending_removed.values())
            and rep.last_applied_seq == rep.state.seq
        ),
        "the last changes reported",
    )
    rep.stop_event.set()
    await task
    await rep.aclose()
    assert server_view(control_plane) == agent_view(res)
    reports = len(control_plane.reports) - before
    assert first < 5, first  # at once (the machine's load decides how fast "at once" is)
    assert 1 <= reports <= spent / rep.min_interval_s + 2, (reports, len(payloads), spent)


async def until(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)
