"""Property tests: any JSON-like body gives a Report or a ReportError naming a field, nothing else."""

import re

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from controlplane.core.agent_report import Report, ReportError, parse_report
from tests.api.helpers import report as valid_report

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FIELD = re.compile(
    r"^(seq|boot_id|sent_at|gpus|engines|residency)(\[\d+\])?(\.[a-z_]+(\[\d+\])*)*$"
)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=25,
)
FIELDS = [
    "seq",
    "boot_id",
    "sent_at",
    "gpus",
    "engines",
    "residency",
    "uuid",
    "index",
    "memory_used",
    "engine_id",
    "block_size",
    "gpu_uuids",
    "mode",
    "stored",
    "removed",
    "cleared",
    "metrics",
]


def _check(body) -> None:
    try:
        assert isinstance(parse_report(body, max_deltas=1000), Report)
    except ReportError as exc:
        # The top-level "expected an object" is the only error without a field.
        assert exc.field == "" or FIELD.match(exc.field), exc.field
        assert exc.detail


@FAST
@given(json_values)
def test_any_json_value_is_a_report_or_a_field_error(body):
    _check(body)


@st.composite
def mutated_reports(draw):
    """A valid report with one value somewhere inside replaced by something arbitrary."""
    body = valid_report(
        draw(st.integers(min_value=1, max_value=5)),
        stored=[(1, None, "GPU", 0), (2, 1, "GPU", 0)],
        removed=[(3, "GPU")],
    )
    path, node = [], body
    while isinstance(node, (dict, list)) and node and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
        path.append(key)
        node = node[key]
    target = body
    for key in path[:-1]:
        target = target[key]
    replacement = draw(json_values)
    if not path:
        return replacement
    if isinstance(target, dict) and draw(st.booleans()):
        target[draw(st.sampled_from(FIELDS))] = replacement  # maybe a key that is not there yet
    else:
        target[path[-1]] = replacement
    return body


def _with_gpu(name, value):
    body = valid_report(1)
    body["gpus"][0][name] = value
    return body


@FAST
@given(mutated_reports())
@example(_with_gpu("memory_used", float("inf")))  # found by review: int(inf) overflowed
@example(_with_gpu("memory_total", 2**64))  # would overflow the database column
@example(_with_gpu("utilization_gpu", float("nan")))
def test_a_report_with_any_value_replaced_is_a_report_or_a_field_error(body):
    _check(body)


def test_the_unmutated_report_parses():
    assert parse_report(valid_report(1, stored=[(1, None, "GPU", 0)])).seq == 1
