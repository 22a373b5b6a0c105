"""A real agent process follows a real vLLM engine's KV events into a real control plane.

The truth each test compares with is the engine's own: the canonical keys of the full blocks of
the prompts it served (``wire.blockhash``, block size 32) and the block hashes its
replay socket says it announced, read here without the agent's code.
"""

from __future__ import annotations

import pytest

from harness.processes import wait_for
from harness.realvllm.engine import BLOCK_SIZE
from nodeagent.engine_residency import EngineResidency
from nodeagent.subscriber import EngineSubscriber
from tests.realvllm.helpers import (
    Announced,
    burst,
    engine_blocks,
    fresh,
    lookup_depth,
    prompts,
    settle,
    start_agent,
)
from wire import blockhash

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.mark.parametrize("side", ["bind", "connect"])
def test_residency_equals_what_the_engine_announced(vllm_engines, plane, tmp_path, side):
    """bind: vLLM binds tcp://*:P, the agent connects; connect: vLLM connects to
    tcp://127.0.0.1:P, the agent binds. Either way the control plane ends up with exactly the
    engine's blocks, under the keys the control plane computes for the same token ids."""
    engine = vllm_engines[side]
    fresh(engine)
    agent = start_agent(plane, engine, tmp_path / "agent")
    try:
        wait_for(lambda: engine.name in engine_blocks(plane), 30, what="the engine reported")
        batch = prompts(seed=1)
        want = burst(engine, batch)
        settle(plane, engine.name, len(want))
        assert len(Announced(engine).resident()) == len(want), "the engine announced other blocks"
        for p in batch:
            keys, depth = lookup_depth(plane, p, engine.name)
            assert keys == blockhash.chain_keys(p, BLOCK_SIZE)
            assert depth == len(keys), "the agent's canonical keys differ from the control plane's"
            # The engine serves the same prefix from cache: every full block (but the last token,
            # which it always computes).
            assert engine.cached_tokens(p) == (len(p) - 1) // BLOCK_SIZE * BLOCK_SIZE
        assert agent.alive()
    finally:
        agent.stop()
        print(agent.tail())


def test_agent_keys_equal_control_plane_keys_for_the_same_token_ids(vllm_engines):
    """The agent's mapping of the engine's BlockStored events (replayed from the real socket)
    gives, block for block, blockhash.chain_keys of the prompt at block size 32."""
    engine = vllm_engines["bind"]
    fresh(engine)
    prompt = prompts(seed=7, n=1, prefix_len=333)[0]
    engine.complete(prompt)
    res = EngineResidency(engine.name, BLOCK_SIZE)
    for _, events in Announced(engine).batches():
        res.apply_events(events)
    rows = {row[0]: row for medium in res.blocks.values() for row in medium.values()}
    chain = blockhash.chain_keys(prompt, BLOCK_SIZE)
    assert set(rows) == set(chain) and res.stats.engine_scoped == 0
    parents = [blockhash.ROOT_PARENT, *chain[:-1]]
    assert [rows[k][1] or blockhash.ROOT_PARENT for k in chain] == parents


def test_a_lost_message_is_recovered_through_the_real_replay_socket(vllm_engines):
    """A live batch lost on the way (as a network or a slow subscriber loses them) is fetched
    again from vLLM's replay socket: no resync, nothing missing."""
    engine = vllm_engines["bind"]
    fresh(engine)
    res = EngineResidency(engine.name, BLOCK_SIZE)
    sub = EngineSubscriber(
        res, engine.agent_engine()["kv_events"], engine.replay_endpoint, engine.topic
    )
    apply, dropped = sub.tracker.on_message, []

    def lossy(seq: int, payload: bytes) -> None:
        if not dropped and sub.tracker.last_seq is not None:
            dropped.append(seq)  # the first live batch after the catch-up never arrives
            return
        apply(seq, payload)

    sub.tracker.on_message = lossy  # type: ignore[method-assign]
    sub.start()
    try:
        assert sub.connected.wait(5)
        assert sub.caught_up.wait(15), "the catch-up from the replay socket did not end"
        batch = prompts(seed=3, n=6)
        want = set()
        for p in batch:  # one batch per request: the second one is lost
            want |= burst(engine, [p])
        wait_for(
            lambda: len(res.resident_hashes()) == len(want),
            20,
            what=f"{len(want)} blocks (have {len(res.resident_hashes())})",
        )
        st = sub.tracker.stats
        assert dropped and st.gaps == 1 and st.replayed >= 1 and st.resyncs == 0
        assert {r[0] for m in res.blocks.values() for r in m.values()} == want
    finally:
        sub.stop()
        sub.join(5)


def test_agent_stopped_while_requests_continue_catches_up_from_the_replay_socket(
    vllm_engines, plane, tmp_path
):
    engine = vllm_engines["connect"]  # the agent binds: while it is down vLLM's PUB has no peer
    fresh(engine)
    agent = start_agent(plane, engine, tmp_path / "agent")
    try:
        wait_for(lambda: engine.name in engine_blocks(plane), 30, what="the engine reported")
        want = burst(engine, prompts(seed=11, n=4))
        settle(plane, engine.name, len(want))
        agent.stop()
        want |= burst(engine, prompts(seed=12, n=6))  # nobody listens to these
        agent.start()
        settle(plane, engine.name, len(want))
        assert "caught up on" in agent.tail(20000)
        for p in prompts(seed=12, n=6):
            keys, depth = lookup_depth(plane, p, engine.name)
            assert depth == len(keys)
    finally:
        agent.stop()
        print(agent.tail())


def test_all_blocks_cleared_and_engine_restart_reset_residency(vllm_engines, plane, tmp_path):
    engine = vllm_engines["connect"]
    fresh(engine)
    agent = start_agent(plane, engine, tmp_path / "agent")
    try:
        wait_for(lambda: engine.name in engine_blocks(plane), 30, what="the engine reported")
        want = burst(engine, prompts(seed=21, n=5))
        settle(plane, engine.name, len(want))
        # AllBlocksCleared (reset_prefix_cache) goes out with the engine's next step.
        assert engine.reset_prefix_cache()
        after = burst(engine, prompts(seed=22, n=1))
        settle(plane, engine.name, len(after))
        assert not after & want
        # A restarted engine numbers its batches from 0 again and forgets every block.
        engine.restart()
        again = burst(engine, prompts(seed=23, n=2))
        settle(plane, engine.name, len(again))
        first = prompts(seed=22, n=1)[0]
        assert lookup_depth(plane, first, engine.name)[1] == 0
        assert agent.alive()
        assert "sequence reset" in agent.tail(20000)
    finally:
        agent.stop()
        print(agent.tail())
