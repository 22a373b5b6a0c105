"""How request records are grouped into workload keys (pure; the demand rollup uses it).

Rule (documented for users in docs/api.md):
- A request's prefix group is the canonical key of the block that ends at or before
  ``group_tokens`` tokens into its prompt (default 1024 tokens): requests that share their first
  ``group_tokens`` tokens (typically a system prompt, tool list or shared document) share a group.
  A prompt shorter than that uses its last full block; one with no full block goes to group "*".
- Each (tenant, model) has at most ``max_groups`` groups; requests that would open another group
  are counted under "*", so a tenant with unbounded distinct prefixes cannot grow the table.
- A group remembers the longest chain all its requests shared so far (the intersection of their
  leading keys), which is what the planner replicates.
"""

from __future__ import annotations

from collections.abc import Sequence

OTHER = "*"


def group_depth(block_size: int, group_tokens: int) -> int:
    return max(1, group_tokens // max(1, block_size))


def group_of(keys: Sequence[int], block_size: int, group_tokens: int = 1024) -> int | None:
    """The key that names a request's group, or None when the prompt has no full block."""
    if not keys:
        return None
    depth = min(len(keys), group_depth(block_size, group_tokens))
    return keys[depth - 1]


def shared_chain(current: Sequence[int] | None, keys: Sequence[int]) -> list[int]:
    """The longest common leading chain of a group so far and one more request."""
    if current is None:
        return list(keys)
    n = 0
    for a, b in zip(current, keys):  # noqa: B905 - lengths differ by design
        if a != b:
            break
        n += 1
    return list(current[:n])
