"""The gateway-like request driver without engines: trace slices as token-id prompts, routing by
the control plane's residency, request records with served engine and cached tokens."""

from __future__ import annotations

import json

import httpx

from controlplane.core.prefix_groups import group_of
from harness.realvllm import driver
from harness.realvllm.driver import BLOCK, MAX_PROMPT, Gateway, Target
from wire import blockhash


def test_a_trace_block_becomes_the_same_vllm_block_everywhere():
    a = driver.prompt_of((7, 8, 9), 100, salt=1)
    b = driver.prompt_of((7, 8, 10), 100, salt=2)
    assert a[: 2 * BLOCK] == b[: 2 * BLOCK] and a[2 * BLOCK : 3 * BLOCK] != b[2 * BLOCK : 3 * BLOCK]
    assert len(a) == 3 * BLOCK + 100 * BLOCK // 512 + 1  # the tail divided by 16, rounded up
    assert all(4 <= t < 2048 for t in a)
    long = driver.prompt_of(tuple(range(500)), 10_000, salt=3)
    assert len(long) <= MAX_PROMPT


def test_servegen_tenants_each_share_one_prefix_group():
    reqs = driver.servegen(duration_s=600.0)
    assert reqs and [r.at_s for r in reqs] == sorted(r.at_s for r in reqs)
    by_tenant: dict[str, list[list[int]]] = {}
    for r in reqs:
        assert len(r.token_ids) <= MAX_PROMPT and 1 <= r.max_tokens <= 8
        by_tenant.setdefault(r.tenant, []).append(r.token_ids)
    assert len(by_tenant) == 4
    for prompts in by_tenant.values():
        heads = {group_of(blockhash.chain_keys(p, BLOCK), BLOCK) for p in prompts}
        assert len(heads) == 1  # every request of a tenant falls in its tenant's group


def _fake(holders: dict[str, int], cached: int, posted: list, fail_posts: int = 0):
    state = {"fail": fail_posts}

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/residency/lookup/":
            state["lookups"] = state.get("lookups", 0) + 1
            return httpx.Response(
                200,
                json={
                    "keys": [],
                    "holders": [
                        {"engine_name": e, "node": {"a": "n1", "b": "n2"}[e], "depth": d}
                        for e, d in holders.items()
                    ],
                },
            )
        if request.url.path == "/v1/completions":  # streamed, as the driver asks
            body = json.loads(request.content)
            state.setdefault("tenants", []).append(request.headers.get("X-Prewarm-Tenant"))
            assert body["stream"] and body["stream_options"] == {"include_usage": True}
            usage = {
                "prompt_tokens": len(body["prompt"]),
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            chunks = [{"choices": [{"text": " w5"}]}, {"choices": [], "usage": usage}]
            sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})
        if request.url.path == "/api/request-records/":
            if state["fail"]:
                state["fail"] -= 1
                return httpx.Response(503)
            posted.extend(json.loads(request.content)["records"])
            return httpx.Response(200, json={"accepted": 1})
        return httpx.Response(404)

    client = httpx.Client(transport=httpx.MockTransport(handle))
    client.state = state  # type: ignore[attr-defined]
    return client


def test_routes_to_the_deepest_serving_holder_and_records_what_served_it():
    posted: list = []
    targets = [Target("a", "http://a", node="n1"), Target("b", "http://b", node="n2")]
    gw = Gateway("http://cp", "pwg_x", targets, client=_fake({"a": 1, "b": 3}, 64, posted))
    rec = gw.send(list(range(4, 104)))
    assert rec["engine"] == "n2/b" and rec["cached_tokens"] == 64 and rec["prompt_tokens"] == 100
    assert rec["block_size"] == BLOCK and rec["token_ids"] == list(range(4, 104))
    assert 0 < rec["ttft_s"] < 10  # measured to the first streamed token
    # b is not serving (it joins later): the holder that serves is a.
    gw.targets["b"].serving = False
    assert gw.send(list(range(4, 104)))["engine"] == "n1/a"
    assert gw.flush() == 2 and [r["engine"] for r in posted] == ["n2/b", "n1/a"]
    assert gw.summary()["routed_by_residency"] == 2


def test_no_holder_goes_to_the_least_busy_and_a_failed_post_is_kept():
    posted: list = []
    gw = Gateway(
        "http://cp",
        "pwg_x",
        [Target("a", "http://a"), Target("b", "http://b")],
        client=_fake({}, 0, posted, fail_posts=1),
    )
    served = [gw.send([5] * 40)["engine"] for _ in range(4)]
    assert sorted(served) == ["a", "a", "b", "b"]
    assert gw.flush() == 0 and gw.stats.post_failures == 1
    assert gw.flush() == 4 and len(posted) == 4


def test_in_front_of_a_router_it_only_generates_load_and_names_the_tenant():
    """With a router (and request taps) in front: every request goes to the router, each names
    its tenant in the header the taps read, no residency lookup, no record posted."""
    posted: list = []
    client = _fake({"a": 3}, 64, posted)
    gw = Gateway(
        "http://cp", "", [Target("router", "http://router")], client=client, post_records=False
    )
    assert gw.send([5] * 40, tenant="t1")["cached_tokens"] == 64
    assert gw.send([6] * 40, tenant="t2")["engine"] == "router"
    assert gw.flush() == 0 and posted == [] and gw.summary()["routed_by_residency"] == 0
    assert client.state["tenants"] == ["t1", "t2"] and "lookups" not in client.state


def test_the_lifecycle_scheduler_takes_the_legal_path_and_tells_the_gateway():
    """serving -> warming goes through draining; the gateway routes only to serving engines;
    a change the control plane refuses leaves the state as it was."""
    from harness.lifecycle import Lifecycles, Operator

    posted: list[tuple[int, str]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/engines/":
            return httpx.Response(
                200,
                json={
                    "results": [
                        {"id": 7, "node_name": "n1", "engine_id": "a", "lifecycle": "serving"},
                        {"id": 8, "node_name": "n2", "engine_id": "b", "lifecycle": "serving"},
                    ],
                    "next": None,
                },
            )
        pk = int(request.url.path.split("/")[3])
        want = json.loads(request.content)["lifecycle"]
        if pk == 8 and want == "warming" and posted[-1:] != [(8, "draining")]:
            return httpx.Response(400, json={"detail": "serving -> warming is not allowed"})
        posted.append((pk, want))
        return httpx.Response(200, json={})

    op = Operator("http://cp", "pwu_x")
    op.client = httpx.Client(transport=httpx.MockTransport(handle))
    gw = Gateway(
        "http://cp",
        "pwg_x",
        [Target("a", "http://a", node="n1"), Target("b", "http://b", node="n2")],
    )
    lc = Lifecycles(op, "test", on_change=gw.set_serving)
    assert lc.find({("n1", "a"), ("n2", "b")}) and lc.pk == {"a": 7, "b": 8}
    assert lc.want("b", "warming", "joins again")
    assert posted == [(8, "draining"), (8, "warming")] and lc.state["b"] == "warming"
    assert not gw.targets["b"].serving and gw.targets["a"].serving
    assert lc.want("b", "serving", "serves") and gw.targets["b"].serving
    assert lc.changes == [("b", "warming"), ("b", "serving")]
    # Announced and serving at the same moment (the bench's reactive arm): warming first, so
    # that the engine ends up serving.
    import threading

    posted.clear()
    lc.run({"b": (0.0, 0.0)}, threading.Event())
    assert posted == [(8, "draining"), (8, "warming"), (8, "serving")]
    assert lc.state["b"] == "serving" and gw.targets["b"].serving
    op.client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(403)))
    assert not lc.want("a", "draining", "refused") and lc.state["a"] == "serving"
    assert gw.targets["a"].serving
