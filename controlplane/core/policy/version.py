"""The replication policy's version: one number, raised with every change to what the policy
decides (a rule, a default, an input). Results made by running the policy record the version
they were made with, so a stale one is found by comparing numbers: the simulator's speculation
map (``controlplane.sim.speculation_map.stale``), which the scoreboard reads as its prior, fails
its test when it is older than this.
"""

POLICY_VERSION = 3
