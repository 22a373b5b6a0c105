"""The one replication policy: everything that decides copies, pure and shared.

The simulator (``controlplane.sim.planned``, through ``controlplane.sim.adapter``) and the live
control plane (``controlplane.replication.plans``) each feed it through a thin adapter, so what
the simulator measures is what runs.

- ``types``: the vocabulary (candidates, demand, holdings, engine states, budgets, items).
- ``knobs``: each policy knob's default and range, declared once (the model, the API, the
  budgets and the launchers read them).
- ``inputs``: the input rules (load, queue, link queue, room and displaced value), decided once.
- ``onset``: a burst's onset seen on arrivals, and when it re-plans the prefix at once.
- ``reactive``: the guarded reactive rule, its measured-demand test, Mooncake's hot fanout.
- ``retention``: which holders keep (lease) a prefix until the next round.
- ``planner``: what to copy where, with ``backoff`` (its back-off on queues) and ``targets``
  (its choice of target and source).
- ``value``: the value model's terms, modelled against measured, and the correction the
  planner applies.
- ``strategy``: the strategies (``reactive``, ``predictive``, ``off``) and the planner call.
- ``harm_guard``: the harm guard (AIMD): what the last copies did cuts or grows the allowance of
  each engine and prefix group; ``strategy.plan_moves`` applies it to the planner's items.

"""
