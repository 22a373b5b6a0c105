"""The fleet doctor's checks on engine views as agents report them: each fault is named with
its setting, and a healthy fleet gives no finding."""

from dataclasses import replace

import pytest

from controlplane.core import doctor as d

NOW = 1_000_000.0
LIMITS = d.Limits()


def engine(name="n1/vllm-0", model="m", block_size=32, **doc):
    base = {
        "cache_config": {
            "block_size": str(block_size),
            "prefix_caching_hash_algo": "sha256",
            "enable_prefix_caching": "True",
        },
        "topic": "",
        "subscribed_topic": "",
        "last_event_at": NOW - 5,
        "replay_answered": True,
        "event_block_size": block_size,
        "roots": {"00000000000000aa": "1111111111111111"},
        "tap": {
            "requests": 10,
            "short_prompts": 0,
            "predicted_hits": 5,
            "predicted_hits_served_cold": 0,
            "last_stored_at": NOW - 6,
        },
    }
    base.update(doc)
    return d.EngineView(name, model, block_size, base, ("warmup",))


def checks(engines, transport=""):
    return [f.check for f in d.examine(engines, NOW, LIMITS, transport)]


def test_a_healthy_fleet_gives_no_finding():
    assert d.examine([engine(), engine("n2/vllm-0")], NOW, LIMITS, "warmup") == []


def test_engines_of_one_model_with_different_block_sizes():
    found = d.examine([engine(), engine("n2/vllm-0", block_size=64)], NOW, LIMITS)
    assert [f.check for f in found] == [d.BLOCK_SIZE_MISMATCH]
    assert "--block-size" in found[0].setting and "n2/vllm-0: 64" in found[0].detail


def test_an_agent_keying_an_engine_with_the_wrong_block_size():
    wrong = replace(engine(), block_size=16)
    found = d.examine([wrong], NOW, LIMITS)
    assert [f.check for f in found] == [d.BLOCK_SIZE_WRONG]
    assert "block_size = 32" in found[0].setting


def test_hash_algorithm_and_seed_that_differ_across_engines():
    other = engine(
        "n2/vllm-0",
        cache_config={"block_size": "32", "prefix_caching_hash_algo": "xxhash"},
        roots={"00000000000000aa": "2222222222222222"},
    )
    found = checks([engine(), other])
    assert found == [d.HASH_ALGO_MISMATCH, d.HASH_SEED_MISMATCH]
    seed = d.examine([engine(), other], NOW, LIMITS)[1]
    assert "PYTHONHASHSEED" in seed.setting
    assert "n1/vllm-0 hash it 1111111111111111; n2/vllm-0 hash it 2222222222222222" in seed.detail


def test_different_prompts_are_no_hash_disagreement():
    other = engine("n2/vllm-0", roots={"00000000000000bb": "2222222222222222"})
    assert checks([engine(), other]) == []


def test_a_topic_the_router_drops():
    found = d.examine([engine(topic="kv")], NOW, LIMITS)
    assert [f.check for f in found] == [d.TOPIC_DROPPED]
    assert '"topic": ""' in found[0].setting
    assert checks([engine(topic="kv")]) and not d.examine(
        [engine(topic="kv")], NOW, replace(LIMITS, router_topic=d.ANY_TOPIC)
    )


@pytest.mark.parametrize(
    ("last_event", "want"), [(None, d.EVENTS_NONE), (NOW - 100, d.EVENTS_STOPPED)]
)
def test_events_that_never_came_or_stopped(last_event, want):
    tap = {**engine().doctor["tap"], "last_stored_at": NOW - 10}
    assert checks([engine(last_event_at=last_event, tap=tap)]) == [want]


def test_an_unanswered_replay_socket():
    assert checks([engine(replay_answered=False)]) == [d.REPLAY_UNANSWERED]
    assert checks([engine(replay_answered=None)]) == []  # never asked: nothing to say


def test_prompts_shorter_than_a_block():
    tap = {**engine().doctor["tap"], "short_prompts": 6}
    assert checks([engine(tap=tap)]) == [d.SHORT_PROMPTS]
    tap["requests"] = 2  # too few to judge
    tap["short_prompts"] = 2
    assert checks([engine(tap=tap)]) == []


def test_predicted_hits_served_cold():
    tap = {**engine().doctor["tap"], "predicted_hits": 4, "predicted_hits_served_cold": 3}
    assert checks([engine(tap=tap)]) == [d.PREDICTED_NOT_DELIVERED]


def test_a_policy_transport_a_node_does_not_run():
    found = d.examine([engine()], NOW, LIMITS, "lmcache")
    assert [(f.check, f.subject) for f in found] == [(d.TRANSPORT_MISSING, "n1")]
    assert "transfer.transports" in found[0].setting
    # an agent that does not say its transports is not judged
    assert d.examine([replace(engine(), node_transports=None)], NOW, LIMITS, "lmcache") == []


def test_prefix_caching_off():
    cfg = {"block_size": "32", "enable_prefix_caching": "False"}
    assert checks([engine(cache_config=cfg)]) == [d.PREFIX_CACHING_OFF]
