"""Live ZMQ: the subscriber against a publisher speaking vLLM's protocol, replay included."""

import time

import pytest

from harness.event_publisher import TestPublisher
from nodeagent.engine_residency import EngineResidency
from nodeagent.subscriber import EngineSubscriber
from tests.agent.conftest import load_messages


@pytest.fixture
def publisher():
    pub = TestPublisher()
    yield pub
    pub.close()


def run(publisher, frames, lost=(), buffer_size=1000, first_seq=0):
    publisher.buffer_size = buffer_size
    res = EngineResidency("vllm-0", 16)
    sub = EngineSubscriber(res, publisher.endpoint, publisher.replay_endpoint)
    before = publisher.subscriptions
    sub.start()
    publisher.wait_subscribed(before)  # PUB/SUB: what is sent before the subscription is lost
    # The start-up catch-up from the replay socket comes first: once it is done, what is
    # published next arrives live (and a lost frame is a gap), not in the catch-up.
    assert sub.caught_up.wait(30), "the subscriber's start-up catch-up never finished"
    for i, (topic, _seq, payload) in enumerate(frames):
        publisher.publish(topic, first_seq + i, payload, deliver=i not in lost)
    deadline = time.monotonic() + 30  # a ceiling: the last frame normally lands in milliseconds
    while sub.tracker.last_seq != first_seq + len(frames) - 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    sub.stop()
    sub.join(5)
    return res, sub.tracker


def test_in_order_stream_matches_expected(publisher):
    frames, expected = load_messages("0.33.0")
    res, tracker = run(publisher, frames)
    assert res.resident_hashes() == set(expected["resident_after_all"])
    assert tracker.stats.gaps == 0


def test_gap_is_recovered_from_the_replay_socket(publisher):
    frames, expected = load_messages("0.10.1")
    res, tracker = run(publisher, frames, lost={12, 13, 40})
    assert tracker.stats.gaps == 2 and tracker.stats.replayed == 3
    assert tracker.stats.resyncs == 0
    # 0: the catch-up at start (nothing buffered yet), then one request per gap.
    assert publisher.replay_requests == [0, 12, 40]
    assert res.resident_hashes() == set(expected["resident_after_all"])


def test_gap_beyond_the_replay_buffer_resyncs(publisher):
    frames, expected = load_messages("0.33.0")
    # The buffer keeps 1 message, so the lost 45..46 cannot be replayed.
    res, tracker = run(publisher, frames, lost={45, 46}, buffer_size=1)
    assert tracker.stats.gaps == 1 and tracker.stats.resyncs == 1
    held = res.resident_hashes()
    # After the resync the agent claims only blocks stored after the gap: nothing stale.
    assert held and held < set(expected["resident_after_all"])
    assert res.snapshot_needed


def test_sequence_reset_clears_the_engine(publisher):
    frames, _ = load_messages("0.33.0")
    res, tracker = run(publisher, frames[:20], first_seq=100)
    assert res.block_count() > 0
    res.take_entry()
    # The engine restarts: its sequence numbers start again at 0, its hash seed changed.
    tracker.on_message(0, frames[20][2])
    assert tracker.stats.restarts == 1
    only_new = EngineResidency("vllm-0", 16)
    only_new.apply_events(
        __import__("nodeagent.kvevents").kvevents.decode_payload(frames[20][2])[1]
    )
    assert res.resident_hashes() == only_new.resident_hashes()
    assert res.take_entry()["mode"] == "snapshot"


def _batch(seq: int, tokens: list[int]) -> bytes:
    import msgpack

    event = {
        "type": "BlockStored",
        "block_hashes": [1000 + seq],
        "parent_block_hash": None,
        "token_ids": tokens,
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
    }
    return msgpack.packb([float(seq), [event], 0])


def _history(n: int) -> list[tuple[int, bytes]]:
    return [(s, _batch(s, [s, s + 1, s + 2, s + 3])) for s in range(n)]


def test_a_restarted_agent_catches_up_from_the_replay_socket_and_skips_duplicates():
    from nodeagent.subscriber import SequenceTracker

    history = _history(5)
    tracker = SequenceTracker(
        EngineResidency("e", 4), lambda start: [m for m in history if m[0] >= start]
    )
    assert tracker.catch_up() == 5
    assert tracker.last_seq == 4 and tracker.residency.block_count() == 5
    # The SUB socket had queued the last two batches meanwhile: duplicates, not a restart.
    tracker.on_message(3, history[3][1])
    tracker.on_message(4, history[4][1])
    assert tracker.stats.duplicates == 2 and tracker.stats.restarts == 0
    tracker.on_message(5, _batch(5, [9, 9, 9, 9]))
    assert tracker.residency.block_count() == 6 and tracker.stats.gaps == 0
    # A different payload under an old seq after that is an engine restart.
    tracker.on_message(0, _batch(0, [7, 7, 7, 7]))
    assert tracker.stats.restarts == 1 and tracker.residency.block_count() == 1


def test_first_live_message_after_a_missed_start_is_joined_by_replay():
    from nodeagent.subscriber import SequenceTracker

    history = _history(4)
    tracker = SequenceTracker(
        EngineResidency("e", 4), lambda start: [m for m in history if m[0] >= start]
    )
    tracker.on_message(3, history[3][1])  # 0..2 published before the subscription took
    assert tracker.stats.caught_up == 3 and tracker.residency.block_count() == 4
    assert tracker.stats.gaps == 0 and tracker.stats.resyncs == 0


def test_catch_up_with_a_wrapped_buffer_applies_the_newest_run_only():
    from nodeagent.subscriber import SequenceTracker

    history = _history(6)
    kept = [history[1], history[3], history[4], history[5]]  # 2 lost from the buffer
    tracker = SequenceTracker(EngineResidency("e", 4), lambda start: kept)
    assert tracker.catch_up() == 3 and tracker.last_seq == 5
    assert tracker.residency.block_count() == 3


def test_connect_address_reaches_a_wildcard_on_loopback():
    from nodeagent.subscriber import connect_address

    assert connect_address("tcp://*:5557") == "tcp://127.0.0.1:5557"
    assert connect_address("tcp://0.0.0.0:5557") == "tcp://127.0.0.1:5557"
    assert connect_address("tcp://[::]:5557") == "tcp://[::1]:5557"
    assert connect_address("tcp://10.0.0.7:5557") == "tcp://10.0.0.7:5557"
    assert connect_address("ipc:///run/vllm.sock") == "ipc:///run/vllm.sock"


def test_bind_mode_receives_from_a_publisher_that_connects():
    """vLLM with an explicit address connects its PUB socket: the agent must bind."""
    import zmq

    from harness.processes import free_port, wait_for

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    res = EngineResidency("e", 4)
    sub = EngineSubscriber(res, endpoint, socket_mode="bind")
    sub.start()
    assert sub.connected.wait(5)
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.connect(endpoint)
    try:
        seq = 0

        def delivered() -> bool:  # PUB drops what it sends before the subscription arrives
            nonlocal seq
            pub.send_multipart([b"kv", seq.to_bytes(8, "big"), _batch(seq, [1, 2, 3, 4])])
            seq += 1
            time.sleep(0.05)
            return res.block_count() > 0

        wait_for(delivered, 10, interval=0, what="a batch through the bound SUB socket")
    finally:
        sub.stop()
        sub.join(5)
        pub.close()
        ctx.term()


def test_unknown_socket_mode_is_refused():
    with pytest.raises(ValueError, match="connect or bind"):
        EngineSubscriber(EngineResidency("e", 4), "tcp://127.0.0.1:1", socket_mode="listen")
