"""Virtual cluster: the simulator's engines played in scaled real time for real agents.

Programmatic use::

    from harness.virtual.cluster import VirtualCluster
    from harness.virtual.options import Options
    from harness.virtual.presets import build_preset

    setup, preset = build_preset("burst")
    vc = VirtualCluster(setup, Options(control_plane_url=url, gateway_token=gw,
                                       operator_token=op, workdir=path,
                                       time_scale=preset.time_scale))
    configs = vc.agent_configs()        # one agent TOML per node
    ... start prewarm-agent --config <each>, with PREWARM_AGENT_ENROLMENT_TOKEN set ...
    vc.run(duration_s=60)               # blocks; vc.stop() from another thread ends it
    print(vc.summary()); vc.close()

CLI: ``prewarm-sim cluster --preset burst --control-plane URL ...`` (``docs/simulator.md``).
"""
