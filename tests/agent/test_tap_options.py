"""The request tap's options load and are checked like every other agent option."""

import pytest

from nodeagent.config import ConfigError, load_config

BASE = ["--control-plane-url", "http://cp", "--state-dir", "/s"]
ENGINE = (
    '[{"engine_id": "v", "kv_events": "tcp://127.0.0.1:5557", "openai_url": "http://127.0.0.1:8000",'
    ' "tap_listen": "%s"}]'
)


def test_tap_listen_per_engine_and_tap_tenant_from_the_environment():
    env = {"PREWARM_AGENT_ENGINES": ENGINE % "0.0.0.0:8100", "PREWARM_AGENT_TAP_TENANT": "api-key"}
    cfg = load_config(BASE, env=env)
    assert cfg.engines[0].tap_listen == "0.0.0.0:8100" and cfg.tap_tenant == "api-key"
    assert load_config(BASE, env={}).tap_tenant == "model"  # the default
    assert load_config(BASE + ["--tap-tenant", "header:X-Tenant"], env={}).tap_tenant == (
        "header:X-Tenant"
    )


@pytest.mark.parametrize("tenant", ["user", "header:", "header:X Tenant", "api_key"])
def test_a_malformed_tap_tenant_is_refused(tenant):
    with pytest.raises(ConfigError, match="tap_tenant"):
        load_config(BASE + ["--tap-tenant", tenant], env={})


def test_a_malformed_tap_listen_is_refused():
    with pytest.raises(ConfigError, match="tap_listen"):
        load_config(BASE, env={"PREWARM_AGENT_ENGINES": ENGINE % "8100"})


def test_token_ids_every_s_reaches_the_agents_taps(tmp_path):
    from nodeagent.agent import Agent

    env = {"PREWARM_AGENT_ENGINES": ENGINE % "127.0.0.1:0"}
    args = [
        "--control-plane-url",
        "http://cp",
        "--state-dir",
        str(tmp_path),
        "--metrics-listen",
        "",
    ]
    assert load_config(args, env=env).tap_token_ids_every_s == 10.0  # the default
    cfg = load_config([*args, "--tap-token-ids-every-s", "2.5"], env=env)
    agent = Agent(cfg)
    assert [t.token_ids_every_s for t in agent.taps] == [2.5]


@pytest.mark.parametrize("every", ["0", "-1"])
def test_a_token_ids_interval_that_is_not_positive_is_refused(every):
    with pytest.raises(ConfigError, match="tap_token_ids_every_s"):
        load_config(BASE + ["--tap-token-ids-every-s", every], env={})
