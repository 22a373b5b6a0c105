"""The committed speculation map, which the scoreboard reads as its prior, is no older than the
policy: it records the policy version it was made with (``prewarm-sim sweep`` writes it), and a
change to the policy raises ``POLICY_VERSION``, so a map made before it fails here until it is
regenerated (``make speculation-map``)."""

from pathlib import Path

from controlplane.core.policy.version import POLICY_VERSION
from controlplane.sim.speculation_map import MAP_COMMAND, load_map, stale
from controlplane.sim.sweep import markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"


def test_the_committed_map_was_made_with_the_current_policy():
    why = stale(load_map())
    assert not why, why


def test_a_map_older_than_the_policy_or_without_a_version_is_stale():
    assert stale({"policy_version": POLICY_VERSION}) == ""
    assert stale({"policy_version": POLICY_VERSION + 1}) == ""
    older = stale({"policy_version": POLICY_VERSION - 1})
    assert f"policy version {POLICY_VERSION - 1}" in older and MAP_COMMAND in older
    assert "records no policy version" in stale({})
    assert "records no policy version" in stale({"policy_version": "1"})


def test_the_docs_table_is_the_committed_maps():
    """docs/simulator.md shows the committed map, as the sweep prints it."""
    assert markdown(load_map()) in DOC.read_text()
