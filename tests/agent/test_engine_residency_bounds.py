"""The agent's engine-hash -> canonical-key map follows what the engine holds, not its history."""

from nodeagent import engine_residency
from nodeagent.engine_residency import EngineResidency
from wire.blockhash import ROOT_PARENT, block_key

BS = 4


def tokens(i: int) -> list[int]:
    return [i, i + 1, i + 2, i + 3]


def stored(hashes, parent=None, toks=None, medium="GPU"):
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": toks,
        "block_size": BS,
        "lora_id": None,
        "medium": medium,
    }


def removed(hashes, medium="GPU"):
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


def test_blocks_that_left_leave_the_map(monkeypatch):
    monkeypatch.setattr(engine_residency, "FORGOTTEN_LIMIT", 100)
    r = EngineResidency("e", BS)
    for i in range(2_000):  # every request's own blocks: new hashes, stored then evicted
        h = 1_000_000 + 2 * i
        r.apply_events([stored([h, h + 1], None, tokens(i) + tokens(i + 7))])
        r.apply_events([removed([h, h + 1])])
    r.apply_events([stored([5, 6], None, tokens(1) + tokens(2))])  # two blocks stay
    assert set(r.canon) == {5, 6} == r.resident_hashes()
    assert len(r.forgotten) == 100  # the newest of those that left, no more
    assert set(r.forgotten) == set(range(1_003_900, 1_004_000))


def test_a_child_stored_after_its_parent_left_gets_its_canonical_key():
    r = EngineResidency("e", BS)
    r.apply_events([stored([1], None, tokens(0))])
    r.apply_events([removed([1])])
    r.apply_events([stored([2], 1, tokens(9), medium="CPU")])  # an offloaded child, late
    k1 = block_key(ROOT_PARENT, tokens(0))
    assert r.blocks["CPU"][2] == (block_key(k1, tokens(9)), k1, 0)


def test_a_block_on_another_medium_keeps_its_mapping():
    r = EngineResidency("e", BS)
    r.apply_events([stored([1], None, tokens(0)), stored([1], None, tokens(0), medium="CPU")])
    r.apply_events([removed([1])])  # off the GPU, still in CPU memory
    assert 1 in r.canon and 1 not in r.forgotten


def test_clears_and_restarts(monkeypatch):
    monkeypatch.setattr(engine_residency, "FORGOTTEN_LIMIT", 3)
    r = EngineResidency("e", BS)
    r.apply_events([stored([1, 2, 3, 4, 5], None, [t for i in range(5) for t in tokens(i)])])
    r.apply_events([{"type": "AllBlocksCleared"}])
    assert r.canon == {} and list(r.forgotten) == [3, 4, 5]  # the newest stay for late children
    r.reset(engine_restarted=True)  # a new hash seed: no old mapping means anything
    assert r.canon == {} and r.forgotten == {}
