"""The control plane's ``job.assign`` builder (``protocol.job_assign``) and the agent's parser
(``Job.from_message``) are one pair: every field the builder writes is read back unchanged, the
parser reads no field the builder does not write, and values the agent would refuse are refused
when the message is built."""

import dataclasses

import pytest

from nodeagent.transfers.base import Job
from wire import protocol

# The Job attributes that are the agent's own state, not fields of the message.
AGENT_SIDE = {"aborted", "_on_abort", "_abort_lock"}


def full(**overrides):
    """A job.assign with every field set to something other than the parser's default."""
    args = dict(
        job_id="6f1c0d5e-0000-4000-8000-000000000001",
        action=protocol.ACTION_EVICT,
        role=protocol.ROLE_TARGET,
        transport=protocol.TRANSPORT_LMCACHE_MP,
        keys=[0x0123456789ABCDEF, "fedcba9876543210"],
        nbytes=2 * 5242880,
        bytes_per_block=5242880,
        source={"node_id": 3, "engine_id": "vllm-0", "transfer": "10.0.0.7:7701"},
        target={"node_id": 5, "engine_id": "vllm-1", "transfer": "10.0.0.9:7701"},
        rendezvous={"master_addr": "10.0.0.7", "master_port": 29512, "world_size": 2},
        lmcache={"source_instance": "a", "target_instance": "b", "model_name": "m"},
        tokens=[128000, 791, 4062],
        block_size=16,
        hold_until=1764540960.5,
        secret="ab" * 32,
        deadline=1764540060.25,
        attempt=3,
    )
    args.update(overrides)
    return protocol.job_assign(**args)


def test_every_field_survives_the_round_trip():
    msg = full()
    assert msg["type"] == protocol.MSG_JOB_ASSIGN
    assert tuple(msg["job"]) == protocol.JOB_ASSIGN_FIELDS
    job = Job.from_message(msg["job"])
    assert job.id == "6f1c0d5e-0000-4000-8000-000000000001"
    assert (job.action, job.role, job.transport) == (
        protocol.ACTION_EVICT,
        protocol.ROLE_TARGET,
        protocol.TRANSPORT_LMCACHE_MP,
    )
    assert job.keys == [0x0123456789ABCDEF, 0xFEDCBA9876543210]
    assert (job.bytes, job.bytes_per_block) == (2 * 5242880, 5242880)
    assert job.source["engine_id"] == "vllm-0" and job.target["engine_id"] == "vllm-1"
    assert job.rendezvous["master_port"] == 29512
    assert job.lmcache == {"source_instance": "a", "target_instance": "b", "model_name": "m"}
    assert (job.tokens, job.block_size, job.hold_until) == ([128000, 791, 4062], 16, 1764540960.5)
    assert (job.secret, job.deadline, job.attempt) == ("ab" * 32, 1764540060.25, 3)


def test_the_parser_reads_exactly_the_builders_fields():
    parsed = {f.name for f in dataclasses.fields(Job)} - AGENT_SIDE
    assert parsed == set(protocol.JOB_ASSIGN_FIELDS)


def test_keys_travel_as_hex_whichever_form_they_are_given_in():
    assert full(keys=[1, "00000000000000ff"])["job"]["keys"] == [
        "0000000000000001",
        "00000000000000ff",
    ]


@pytest.mark.parametrize(
    "bad",
    [
        {"transport": "carrier-pigeon"},
        {"action": "copy"},
        {"role": "both"},
        {"lmcache": {"controller_url": "http://x"}},
        {"keys": [-1]},
        {"keys": ["not hex"]},
    ],
)
def test_values_the_agent_would_refuse_are_refused_when_built(bad):
    with pytest.raises(protocol.ProtocolError):
        full(**bad)
