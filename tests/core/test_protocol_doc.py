"""docs/agent-protocol.md against wire/protocol.py: the ``job.assign`` block names
every field the builder sends, every transport, action and role, and the LMCache fields the agent
reads; the report response lists every field the control plane answers with."""

import re
from pathlib import Path

from controlplane.agentapi.serializers import ReportResponseSerializer
from wire import protocol

DOC = (Path(__file__).resolve().parents[2] / "docs" / "agent-protocol.md").read_text()


def assign_block() -> str:
    start = DOC.index('    {"type": "job.assign", "job": {')
    return DOC[start : DOC.index('    {"type": "job.cancel"', start)]


def field_text(block: str, name: str) -> str:
    """A top-level field's text: from its line to the next top-level field."""
    lines = block.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f'        "{name}":'))
    end = next(
        (i for i in range(at + 1, len(lines)) if re.match(r'^ {8}"\w+":', lines[i])), len(lines)
    )
    return "\n".join(lines[at:end]).split(":", 1)[1]


def quoted(text: str) -> set[str]:
    return set(re.findall(r'"([^"]+)"', text.split("#")[0]))


def test_job_assign_block_names_exactly_the_builders_fields():
    documented = re.findall(r'^ {8}"(\w+)":', assign_block(), re.M)
    assert documented == list(protocol.JOB_ASSIGN_FIELDS)


def test_job_assign_block_lists_every_transport_action_and_role():
    block = assign_block()
    assert quoted(field_text(block, "transport")) == set(protocol.TRANSPORTS)
    assert quoted(field_text(block, "action")) == set(protocol.ACTIONS)
    assert quoted(field_text(block, "role")) == set(protocol.ROLES)


def test_job_assign_block_shows_the_lmcache_fields_the_agent_reads():
    keys = re.findall(r'"(\w+)":', field_text(assign_block(), protocol.FIELD_LMCACHE))
    assert keys == list(protocol.LMCACHE_FIELDS)


def test_report_response_lists_every_field():
    line = next(x for x in DOC.splitlines() if x.startswith('- `200 {"applied_seq"'))
    assert re.findall(r'"(\w+)":', line) == list(ReportResponseSerializer().fields)
