"""The wire vocabulary has one spelling (wire/protocol.py), and one row codec."""

import ast
import io
import tokenize
from pathlib import Path

import msgpack
import pytest

from wire import protocol

ROOT = Path(__file__).resolve().parents[2]

# Modules that speak the protocol and take every spelling from wire/protocol.py.
# Still to convert (another branch is changing them): controlplane/sim/*.
CONVERTED = [
    "controlplane/core/agent_report.py",
    "controlplane/core/residency_index.py",
    "controlplane/api/parsers.py",
    "controlplane/fleet/services.py",
    "controlplane/fleet/ingestion.py",
    "controlplane/fleet/api/views.py",
    "controlplane/replication/choices.py",
    "nodeagent/reporter.py",
    "nodeagent/engine_residency.py",
    "nodeagent/jobs.py",
    "nodeagent/agent.py",
    "nodeagent/transfers/base.py",
    "nodeagent/transfers/auth.py",
    "nodeagent/transfers/lmcache.py",
    "nodeagent/transfers/lmcache_mp.py",
    "nodeagent/transfers/nccl.py",
    "nodeagent/transfers/tcp.py",
    "nodeagent/transfers/warmup.py",
    "controlplane/replication/jobs/delivery.py",
    "controlplane/replication/jobs/messages.py",
    "controlplane/agentapi/consumer.py",
    "controlplane/agentapi/views.py",
    "controlplane/agentapi/reports.py",
    "controlplane/agentapi/serializers.py",
    "controlplane/agentapi/jobs.py",
    "controlplane/readmodels/cachemap.py",
    "controlplane/readmodels/dashboard.py",
    "controlplane/fleet/models.py",
    "frontend/views.py",
    "frontend/urls.py",
    "bench/ingest.py",
]

# The same words meaning something else: plan and plan-item states, a metric's outcome label,
# a GPU that NVML lost, a method name, a sweep's counts, LMCache's own prefetch states, torch's
# process-group backend, the dashboard socket's first message.
NOT_WIRE = {
    "controlplane/replication/choices.py": {"pending", "approved"},
    "controlplane/core/agent_report.py": {"lost"},
    "controlplane/fleet/ingestion.py": {"lost"},
    "controlplane/fleet/api/views.py": {"lost"},
    "nodeagent/jobs.py": {"evict"},  # an executor's method name
    "nodeagent/reporter.py": {"failed"},
    "controlplane/replication/jobs/delivery.py": {"expired", "failed", "dispatched"},
    "nodeagent/transfers/lmcache_mp.py": {"failed", "cancelled"},
    "nodeagent/transfers/nccl.py": {"nccl"},
    "controlplane/readmodels/cachemap.py": {"lost"},
    "controlplane/readmodels/dashboard.py": {"snapshot"},
}

VOCABULARY = {
    *protocol.TIERS,
    *protocol.MODES,
    protocol.MSG_JOB_ASSIGN,
    protocol.MSG_JOB_CANCEL,
    *protocol.AGENT_MESSAGES,
    *protocol.ROLES,
    *protocol.ACTIONS,
    *protocol.TRANSPORTS,
    *protocol.JOB_STATES,
    protocol.CONTENT_MSGPACK,
    protocol.CONTENT_JSON,
    protocol.ENCODING_MSGPACK,
}


def string_literals(path: Path):
    """(line, value) of each plain string literal outside docstrings."""
    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = node.body[0] if node.body else None
            if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant):
                docstrings.add(doc.lineno)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.STRING and tok.start[0] not in docstrings:
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):
                continue  # f-strings: formatted text, not a vocabulary value
            yield tok.start[0], value


@pytest.mark.parametrize("rel", CONVERTED)
def test_converted_modules_spell_no_wire_vocabulary_themselves(rel):
    stray = [
        f"{rel}:{line}: {value!r}"
        for line, value in string_literals(ROOT / rel)
        if value in VOCABULARY and value not in NOT_WIRE.get(rel, ())
    ]
    assert stray == [], "use wire.protocol's constants:\n" + "\n".join(stray)


def test_the_grep_sees_a_stray_spelling(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""Doc with GPU."""\nTIER = "GPU"\nSTATE = f"{TIER}"\n')
    assert [v for _, v in string_literals(bad)] == ["GPU"]


ROWS = [
    (0, None, protocol.TIER_GPU, 0),
    (2**64 - 1, 7, protocol.TIER_CPU, protocol.FLAG_ENGINE_SCOPED),
    (0xA1B2, 0xA1B1, protocol.TIER_DISK, 0),
]


@pytest.mark.parametrize("hex_keys", [False, True])
def test_what_the_encoder_writes_the_decoder_reads_through_msgpack(hex_keys):
    stored = protocol.encode_stored(ROWS, hex_keys)
    removed = protocol.encode_removed([(5, protocol.TIER_GPU)], hex_keys)
    body = msgpack.unpackb(msgpack.packb({"s": stored, "r": removed}), strict_map_key=False)
    rows, scoped = protocol.decode_stored(body["s"], "stored")
    assert rows == [(k, p, m) for k, p, m, _ in ROWS] and scoped == 1
    assert protocol.decode_removed(body["r"], "removed") == [(5, protocol.TIER_GPU)]
    if hex_keys:
        assert stored[1][:2] == ["ffffffffffffffff", "0000000000000007"]
    else:
        assert stored[1][:2] == [2**64 - 1, 7]


@pytest.mark.parametrize(
    "row, where",
    [
        ([2**64, None, protocol.TIER_GPU, 0], "stored[0][0]"),
        (["xyz", None, protocol.TIER_GPU, 0], "stored[0][0]"),
        ([1, -1, protocol.TIER_GPU, 0], "stored[0][1]"),
        ([1, None, "gpu", 0], "stored[0][2]"),
        ([1, None, [], 0], "stored[0][2]"),
        ([1, None, protocol.TIER_GPU, 256], "stored[0][3]"),
        ([1, None, protocol.TIER_GPU, True], "stored[0][3]"),
        ([1, None], "stored[0]"),
    ],
)
def test_a_bad_row_is_refused_naming_its_field(row, where):
    with pytest.raises(protocol.ProtocolError) as exc:
        protocol.decode_stored([row], "stored")
    assert exc.value.field == where
