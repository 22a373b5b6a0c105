"""The virtual cluster against the agent's own code: its KV events decode to the simulator's
canonical keys in an agent's residency (real ZMQ sockets, vLLM's wire format and replay), its
block files are what an agent's TCP transfer moves, and a copy landing in a target's store
joins that engine's cache and is published. No control plane: ``serve`` and
``apply_store_changes`` are driven directly, on a small ServeGen workload."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from controlplane.sim.scenarios import build
from controlplane.sim.workloads.base import BLOCK_TOKENS, Workload
from harness.virtual.cluster import VirtualCluster
from harness.virtual.engine import block_file
from harness.virtual.options import Options
from harness.virtual.publisher import KvEventPublisher, block_stored
from harness.virtual.tokens import TokenBook
from nodeagent.blockstore import FileBlockStore
from nodeagent.engine_residency import EngineResidency
from nodeagent.kvevents import decode_payload
from nodeagent.subscriber import EngineSubscriber, ReplayClient
from nodeagent.transfers.base import Job
from nodeagent.transfers.tcp import TcpTransferServer, TcpTransport
from wire.blockhash import chain_keys


def wait_for(pred, timeout=30.0, what="condition"):  # a ceiling: events land in milliseconds
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def setup():
    # Loading ServeGen's windows takes seconds: build once; each cluster gets fresh engines.
    return build(
        workload="servegen",
        scenario="steady",
        engines=2,
        model="llama3-8b",
        duration=120.0,
        load=0.3,
        tenants=3,
        prefix_tokens=(1024, 4096),
        seed=1,
    )


@pytest.fixture
def cluster(tmp_path, setup):
    vc = VirtualCluster(
        setup,
        Options(
            control_plane_url="http://127.0.0.1:9",
            gateway_token="unused",
            workdir=tmp_path,
            payload_bytes=2048,
            time_scale=50.0,
        ),
    )
    vc.started_at = time.time()
    subs = []
    for ve in vc.engines:
        res = EngineResidency(ve.engine_id, BLOCK_TOKENS)
        sub = EngineSubscriber(res, ve.publisher.endpoint, ve.publisher.replay_endpoint, "kv")
        sub.start()
        sub.connected.wait(2)
        subs.append(sub)
    time.sleep(0.3)  # ZMQ slow joiner: the SUB's subscription must reach the PUB first
    yield vc, subs
    for s in subs:
        s.stop()
    vc.close()


def canonical(sub: EngineSubscriber) -> set[int]:
    with sub.tracker.residency.lock:
        return {row[0] for row in sub.tracker.residency.blocks.get("GPU", {}).values()}


@pytest.mark.slow  # the module's ServeGen setup takes seconds
def test_agents_see_exactly_the_simulated_caches(cluster):
    vc, subs = cluster
    records = [vc.serve(i, float(vc.workload.t[i])) for i in range(40)]
    for ve, sub in zip(vc.engines, subs, strict=True):
        wait_for(
            lambda ve=ve, sub=sub: canonical(sub) == set(ve.sim.cache.blocks), what=ve.engine_id
        )
        assert sub.tracker.stats.gaps == 0 and sub.tracker.residency.stats.engine_scoped == 0
        on_disk = {int(p.stem, 16) for p in ve.store.glob("*.blk")}
        assert on_disk == set(ve.sim.cache.blocks)
    assert sum(len(ve.sim.cache) for ve in vc.engines) > 0
    r = records[0]
    assert r["block_size"] == BLOCK_TOKENS and r["model"] == vc.model
    prefix = vc.workload.prefixes[int(vc.workload.pid[0])]
    # The first record of a tenant carries the prompt's token ids (what warm-ups need); the
    # others carry keys. Both give the same chain.
    chain = (
        chain_keys(r["token_ids"], BLOCK_TOKENS)
        if "token_ids" in r
        else [int(k, 16) for k in r["keys"]]
    )
    assert chain[: len(prefix)] == list(prefix)
    assert sum("token_ids" in x for x in records) <= 3 and any("keys" in x for x in records)
    assert r["prompt_tokens"] == len(prefix) * BLOCK_TOKENS + int(vc.workload.suffix_tokens[0])
    # A gateway's view of who served it: the engine, the cached tokens it reported, the TTFT.
    names = {f"{vc.opt.node_name(ve.sim.eid)}/{ve.engine_id}" for ve in vc.engines}
    assert all(
        x["engine"] in names and x["ttft_s"] > 0 and 0 <= x["cached_tokens"] <= x["prompt_tokens"]
        for x in records
    )
    times = [rec["time"] for rec in records]
    assert times == sorted(times) and times[-1] - times[0] < 120.0 / 50.0 + 1e-6


@pytest.mark.slow
def test_a_copy_moved_by_agents_joins_the_target_and_is_published(cluster):
    vc, subs = cluster
    i = 0
    while not vc.engines[0].sim.cache.blocks or vc.engines[1].sim.cache.match(
        vc.workload.prefixes[int(vc.workload.pid[i])]
    ) == len(vc.workload.prefixes[int(vc.workload.pid[i])]):
        vc.serve(i, float(vc.workload.t[i]))
        i += 1
    src, dst = vc.engines
    chain = next(
        p
        for p in vc.workload.prefixes
        if p and src.sim.cache.match(p) == len(p) and dst.sim.cache.match(p) < len(p)
    )
    # Real agent transfer: the source agent's file store is the source engine's block files.
    server = TcpTransferServer("127.0.0.1:0", FileBlockStore(dst.store)).start()
    transport = TcpTransport(server)
    deadline = time.time() + 10

    def mk(role):
        return Job(
            "job-1",
            "replicate",
            role,
            "tcp",
            list(chain),
            target={"transfer": server.address},
            secret="job-1-secret",
            deadline=deadline,
        )

    got = {}
    t = threading.Thread(
        target=lambda: got.setdefault("r", transport.receive(mk("target"), None, lambda n: None))
    )
    t.start()
    sent = transport.send(mk("source"), FileBlockStore(src.store), lambda n: None)
    t.join(10)
    server.close()
    assert sent.ok and got["r"].ok and sent.bytes == len(chain) * 2048
    vc.apply_store_changes(float(vc.workload.t[i]))
    assert dst.sim.cache.match(chain) == len(chain)
    wait_for(
        lambda: set(chain) <= canonical(subs[1]), what="the copied chain in the agent's residency"
    )
    assert vc.stats.copies_in_blocks >= 1 and vc.stats.copies_in_bytes >= 2048
    # A stray file that is not the block's bytes is refused.
    block_file(dst.store, 0x1234).write_bytes(b"not a block")
    vc.apply_store_changes(float(vc.workload.t[i]))
    assert dst.engine_hash(0x1234) and 0x1234 not in dst.sim.cache and vc.engines[1].bad_copies == 1
    # An evict job deletes the files: the engine drops the blocks and says so.
    for k in chain:
        block_file(dst.store, k).unlink()
    vc.apply_store_changes(float(vc.workload.t[i]))
    assert not set(chain) & set(dst.sim.cache.blocks)
    wait_for(lambda: not set(chain) & canonical(subs[1]), what="removal in the agent's residency")


def test_publisher_speaks_the_replay_protocol(tmp_path):
    pub = KvEventPublisher("kv@e@m", buffer_size=3)
    try:
        for n in range(5):
            pub.publish([block_stored([n], None, list(range(16)), 16)], ts=float(n))
        import zmq

        got = ReplayClient(zmq.Context.instance(), pub.replay_endpoint)(1)
        assert [s for s, _ in got] == [2, 3, 4]  # buffer of 3; start 1 is no longer held
        ts, events, rank = decode_payload(got[-1][1])
        assert ts == 4.0 and rank == 0 and events[0]["type"] == "BlockStored"
        assert events[0]["block_hashes"] == [4] and events[0]["medium"] == "GPU"
    finally:
        pub.close()


def test_the_replay_buffer_is_bounded_in_bytes_over_a_long_run():
    """Batches carrying long prefixes' token ids: the buffer keeps the newest of them, up to its
    byte bound, however long the engine runs (it held 10,000 batches, ~150 MB an engine in the
    burst demo), and the replay still answers with them in order."""
    pub = KvEventPublisher("kv@e@m", buffer_bytes=1 << 20)
    try:
        tokens = list(range(2**20, 2**20 + 8192))  # one 8k-token prefix's ids: ~40 KB a batch
        held = []
        for n in range(600):  # ~24 MB published
            pub.publish([block_stored([n], None, tokens, 512)], ts=float(n))
            held.append(sum(len(p) for _, p in pub.buffer))
        assert max(held) <= 1 << 20 and pub.buffered_bytes == held[-1]
        assert len(pub.buffer) > 10  # a bound in bytes, not a buffer of one
        import zmq

        got = ReplayClient(zmq.Context.instance(), pub.replay_endpoint)(0)
        assert [s for s, _ in got] == list(range(600 - len(pub.buffer), 600))
    finally:
        pub.close()


def test_token_book_refuses_prefixes_without_synthetic_tokens():
    wl = Workload(
        "other",
        np.zeros(1),
        np.zeros(1, dtype=np.int32),
        np.zeros(1, dtype=np.int32),
        np.zeros(1, dtype=np.int32),
        [(123, 456)],
        ["t0"],
    )
    with pytest.raises(ValueError, match="synthetic token ids"):
        TokenBook(wl)


@pytest.mark.slow
def test_a_warmup_request_prefills_in_sim_time_then_publishes_the_blocks(cluster):
    """The ``warmup`` executor's request, over HTTP as the agent sends it: the engine answers
    once the cost model's prefill time has passed in sim time, then its KV events carry the
    prefix; asked again, it reports the prefix as cached tokens."""
    import httpx

    vc, subs = cluster
    dst = vc.engines[1]
    prefix = next(p for p in vc.workload.prefixes if p and dst.sim.cache.match(p) == 0)
    tokens = [t for k in prefix for t in vc.book.tokens_of(k)]
    url = f"http://127.0.0.1:{vc.http.port}/engines/{dst.engine_id}/v1/completions"
    body = {"model": vc.model, "prompt": tokens, "max_tokens": 1}
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("r", httpx.post(url, json=body, timeout=30)))
    t.start()
    wait_for(lambda: not vc.warmups.queue.empty(), what="the request queued")
    vc.serve_warmups(0.0)
    w = vc.warmups.prefilling[0]
    expect = vc.sim.prefill_s(len(tokens), 0)
    assert w.ready_at == pytest.approx(max(0.0, dst.sim.free_at - expect) + expect)
    vc.serve_warmups(w.ready_at - 1e-6)
    assert t.is_alive() and dst.sim.cache.match(prefix) == 0  # not before its prefill is done
    vc.serve_warmups(w.ready_at)
    t.join(10)
    r = got["r"]
    assert r.status_code == 200 and r.json()["usage"] == {
        "prompt_tokens": len(tokens),
        "completion_tokens": 1,
        "total_tokens": len(tokens) + 1,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert dst.sim.cache.match(prefix) == len(prefix)
    wait_for(
        lambda: set(prefix) <= canonical(subs[1]), what="the warmed prefix in the agent's residency"
    )
    # Asked again: all of it is cached now (vLLM reports full blocks only).
    t = threading.Thread(
        target=lambda: got.__setitem__("r", httpx.post(url, json=body, timeout=30))
    )
    t.start()
    wait_for(lambda: not vc.warmups.queue.empty(), what="the second request queued")
    vc.serve_warmups(w.ready_at)
    vc.serve_warmups(vc.warmups.prefilling[0].ready_at)
    t.join(10)
    assert got["r"].json()["usage"]["prompt_tokens_details"]["cached_tokens"] == len(tokens)
    # A wrong model name or a prompt of foreign tokens is a 400, as vLLM answers it.
    bad = httpx.post(url, json={**body, "model": "other"}, timeout=10)
    assert bad.status_code == 400 and "does not exist" in bad.json()["message"]


@pytest.mark.slow
def test_virtual_gpu_memory_is_the_weights_plus_the_kv_blocks_held(cluster):
    """The agent's simulated GPU source reads what the engine holds, not a fixed share of HBM:
    an empty cache shows the weights alone; serving fills it and memory in use rises with it."""
    import httpx

    vc, _subs = cluster
    cost = vc.setup.config.cost
    weights = cost.model.weight_bytes / cost.gpus

    def gpus(i: int) -> list[dict]:
        url = f"http://127.0.0.1:{vc.http.port}/nodes/{vc.opt.node_name(i)}/gpus"
        return httpx.get(url, timeout=5).json()["gpus"]

    assert {g["memory_used"] for g in gpus(0)} == {int(weights)}
    for i in range(40):
        vc.serve(i, float(vc.workload.t[i]))
    vc.gauges.publish(float(vc.workload.t[39]))
    for ve in vc.engines:
        held = len(ve.sim.cache) * vc.block_bytes / cost.gpus
        used = {g["memory_used"] for g in gpus(ve.sim.eid)}
        assert used == {int(weights + held)}
    assert len({gpus(ve.sim.eid)[0]["memory_used"] for ve in vc.engines}) == 2


@pytest.mark.slow
def test_a_looped_pass_takes_the_joined_engines_out_and_brings_them_back(cluster, monkeypatch):
    """A looping demo replays its scale-out every pass: an engine that joined leaves with its
    KV (agents see every block removed, its store empties) and is announced and serves again
    at the same points of the next pass."""
    from controlplane.sim.cluster import EngineChange
    from controlplane.sim.engine import PLANNED, SERVING, WARMING

    vc, subs = cluster
    for i in range(40):
        vc.serve(i, float(vc.workload.t[i]))
    ve, sub = vc.engines[1], subs[1]
    wait_for(lambda: canonical(sub) == set(ve.sim.cache.blocks) != set(), what="engine 1 filled")
    other = set(vc.engines[0].sim.cache.blocks)
    monkeypatch.setattr(vc.sim.config, "changes", (EngineChange(1, 5.0, 10.0),))
    end = float(vc.workload.t[39]) + 1.0
    vc.sim.events.run_until(end)
    vc._rejoin(end)
    assert ve.sim.state == PLANNED and len(ve.sim.cache) == 0 and vc.stats.rejoins == 1
    wait_for(lambda: canonical(sub) == set(), what="engine 1's blocks published removed")
    assert not list(ve.store.glob("*.blk"))
    assert set(vc.engines[0].sim.cache.blocks) == other  # the engine that stays keeps its KV
    vc.sim.events.run_until(end + 5.0)
    assert ve.sim.state == WARMING
    vc.sim.events.run_until(end + 10.0)
    assert ve.sim.state == SERVING and ve.sim.serving_since == pytest.approx(end + 10.0)
