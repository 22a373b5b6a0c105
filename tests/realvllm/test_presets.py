"""The real-engine presets without engines: what the prefill-heavy preset sends and serves, and
that the demo, the driver and the bench take it by name."""

from __future__ import annotations

import pytest

from harness.realvllm.engine import HEAVY, TINY
from harness.realvllm.model import RECIPES
from harness.realvllm.presets import REAL_PRESETS


def test_the_heavy_preset_sends_prompts_that_are_almost_all_shared_prefix():
    heavy, tiny = REAL_PRESETS["real-heavy"], REAL_PRESETS["real"]
    assert heavy.model == HEAVY and tiny.model == TINY
    reqs = heavy.requests(tenants=4, duration_s=600.0)
    by_tenant: dict[str, list[list[int]]] = {}
    for r in reqs:
        by_tenant.setdefault(r.tenant, []).append(r.token_ids)
    assert len(by_tenant) == 4
    for prompts in by_tenant.values():
        n = len(prompts[0])
        shared = min(
            next((i for i, (a, b) in enumerate(zip(prompts[0], p, strict=False)) if a != b), n)
            for p in prompts[1:]
        )
        assert 1600 <= shared <= 1952  # the tenant's prefix, 1-2k tokens
        # each request's own part: at most 8 tokens, so a hit prefills a few tokens and a
        # miss the whole prefix (the bench checks the ratio that gives, run by run)
        assert all(1 <= len(p) - shared <= 8 for p in prompts)
        assert all(len(p) < heavy.model.max_model_len for p in prompts)
    # the tiny preset's tails are the trace's, hundreds of tokens
    assert max(len(r.token_ids) for r in tiny.requests(duration_s=600.0)) > 1600 + 32


def test_the_heavy_model_is_197m_parameters_and_its_block_size_fits_vllm_cpu():
    r = RECIPES[HEAVY.recipe]
    h, f, layers = r["hidden_size"], r["intermediate_size"], r["num_hidden_layers"]
    kv = h // r["num_attention_heads"] * r["num_key_value_heads"]
    params = 2 * r["vocab_size"] * h + layers * (2 * h * h + 2 * h * kv + 3 * h * f)
    assert 195e6 < params < 199e6
    assert HEAVY.block_size % 32 == 0 and HEAVY.dir != TINY.dir
    # 16 layers x (K, V) x 4 KV heads x 64 dims x 32 tokens x 2 bytes
    assert HEAVY.bytes_per_block == 16 * 2 * 4 * 64 * 32 * 2
    assert HEAVY.kv_capacity_blocks(1) == 2048
    assert TINY.bytes_per_block == 2 * 2 * 2 * 32 * 32 * 2  # what the agents were told before


def test_the_demo_driver_and_bench_take_the_presets_by_name(tmp_path, monkeypatch, capsys):
    import sys

    from harness import demo
    from harness.realvllm import driver

    with pytest.raises(SystemExit) as err:
        demo.main(["--preset", "no-such"])
    assert err.value.code == 2 and "real, real-heavy" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        driver.main(["--control-plane", "http://x", "--preset", "no-such"])
    monkeypatch.setenv("PREWARM_VLLM_PYTHON", sys.executable)  # argv() without .venv-vllm
    engines = REAL_PRESETS["real-heavy"].engines(tmp_path)
    assert [e.name for e in engines] == ["vllm-a", "vllm-b"]
    assert all(e.model == HEAVY and e.events == "bind" for e in engines)
    argv = engines[0].argv()
    assert argv[argv.index("--served-model-name") + 1] == "heavy"
    assert argv[argv.index("--model") + 1] == str(HEAVY.dir)
    entry = engines[0].agent_engine()
    assert entry["model"] == "heavy" and entry["block_size"] == HEAVY.block_size


@pytest.mark.slow  # the ServeGen slice, read twice
def test_the_real_demo_replays_the_tenants_it_imports_history_for_as_many_as_the_ab(
    tmp_path, monkeypatch
):
    """The demo's driver replays the slice's ``TENANTS`` busiest tenants, its history import covers
    the same tenants (else the day-scale forecasts have no past for some keys), and the A/B runs
    (its ``--tenants`` default): enough prefixes for the holdout's draws (``presets.TENANTS``)."""
    from types import SimpleNamespace

    from harness.realvllm import demo, driver
    from harness.realvllm.presets import TENANTS

    preset = REAL_PRESETS["real-heavy"]
    proc = demo._driver(
        preset, "http://cp", "http://router", "t", SimpleNamespace(name="b"), {}, tmp_path
    )
    args = driver._parser().parse_args(proc.argv[3:])
    replayed = {r.tenant for r in preset.requests(tenants=args.tenants, duration_s=args.duration_s)}
    posted: list[list[dict]] = []
    monkeypatch.setattr(
        demo,
        "post_history",
        lambda _cp, _t, rows, _src: posted.append(rows) or {"requests": 0, "rows": 0},
    )
    demo._import_history(preset, "http://cp", "t")
    assert {r["tenant"] for r in posted[0]} == replayed and len(replayed) == TENANTS == 8
