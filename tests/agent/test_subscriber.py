"""Live ZMQ: the subscriber against a publisher speaking vLLM's protocol, replay included."""

import time

import pytest

from nodeagent.residency import EngineResidency
from nodeagent.subscriber import EngineSubscriber
from tests.agent.conftest import load_messages
from tests.agent.vllm_publisher import TestPublisher


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
    assert publisher.replay_requests == [12, 40]
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
