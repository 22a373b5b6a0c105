"""The randomized holdout's assignment: which arm a prefix joins when an item of it is approved
and it has no live record (``decisions._arms`` keeps the arm while it has one).

Permuted blocks, not an independent coin per prefix. A coin leaves small samples lopsided: at
a 50% share, the 3 to 6 prefixes a five-minute demo speculates on all land on one arm one time in
4 to 32, and the comparison has nothing to set against them. A block of ``size`` consecutive
assignments holds out exactly ``held`` of them (``held / size`` = the policy's share), in a
random order: each draw holds out with probability (held left in the block) / (draws left in
the block), which is sampling the block's arms without replacement. Every assignment stays
random and unpredictable from the prefix, the arms are in the policy's proportion at each
block's end, and never further from it than one block in between. The block is the smallest
that fits the share exactly (50%: 1 in 2; 15%: 3 in 20; 10%: 1 in 10), at most
``MAX_BLOCK`` (a share no block of that size fits exactly is rounded to the nearest whole
count in ``MAX_BLOCK``). Each draw is recorded (``HoldoutDraw``): the audit of the
randomization."""

from __future__ import annotations

import random
from datetime import timedelta

from django.utils import timezone

from ..models import HoldoutDraw, PlanItem, Policy

MAX_BLOCK = 100

_uniform = random.SystemRandom().random


def block_shape(share: float) -> tuple[int, int]:
    """(size, held): the smallest block holding out exactly ``share`` of its assignments."""
    if share <= 0:
        return 1, 0
    for size in range(1, MAX_BLOCK + 1):
        held = size * share
        if round(held) >= 1 and abs(held - round(held)) < 1e-6:
            return size, round(held)
    return MAX_BLOCK, max(1, min(MAX_BLOCK, round(MAX_BLOCK * share)))


def window(policy: Policy, item: PlanItem, now=None):
    """The assignment's measuring window, the same whichever arm it draws: from the decision plus
    the item's modelled placement time (when its copy would land) for the policy's replica TTL.
    A treated copy that lands late, fails or is never confirmed changes neither end."""
    start = (now or timezone.now()) + timedelta(seconds=max(0.0, item.cost_s))
    return start, start + timedelta(seconds=policy.replica_ttl_s)


def assign(policy: Policy, item: PlanItem, share: float, now=None) -> HoldoutDraw:
    """Draw the arm of ``item``'s prefix (``held_out``) and record the draw, with its window
    from the decision's time ``now``. Call inside the
    decision's transaction: the policy's row is locked so concurrent decisions draw in turn."""
    Policy.objects.select_for_update().filter(pk=policy.pk).first()
    size, held = block_shape(share)
    last = HoldoutDraw.objects.filter(policy=policy).order_by("-pk").first()
    if last and (last.block_size, last.block_held) == (size, held) and last.position < size:
        block, done, held_so_far = last.block, last.position, last.held_so_far
    else:  # a new block: the first draw, the last block complete, or the share changed
        block, done, held_so_far = (last.block + 1 if last else 0), 0, 0
    p = (held - held_so_far) / (size - done)
    out = _uniform() < p
    start, end = window(policy, item, now)
    return HoldoutDraw.objects.create(
        window_start=start,
        window_end=end,
        tokens=item.prefix_tokens or len(item.prefix_keys) * item.target.block_size,
        policy=policy,
        workload_key_id=item.workload_key_id,
        item=item,
        held_out=out,
        probability=p,
        block=block,
        block_size=size,
        block_held=held,
        position=done + 1,
        held_so_far=held_so_far + out,
    )
