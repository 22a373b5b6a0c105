"""Rerun some policies of grid jobs (``prewarm-sim grid`` asks for reactive and predictive in
every job): the same jobs, ``controlplane.sim.grid.job_for``, appended to OUT.jsonl and skipped
when there; ``merge_rerun.py`` puts them beside the policies a change does not touch.
Usage: python docs/sim-issue20/rerun.py OUT.jsonl setting:model:scenario[,...] SEEDS POLICIES
(e.g. ``... servegen:llama3-70b:slowlink 0,1,2 predictive,oracle``)."""

import sys
from argparse import Namespace
from pathlib import Path

from controlplane.sim.grid import job_for, parse_cells, run_grid

out, cells, seeds, policies = sys.argv[1:5]
args = Namespace(policies=policies.split(","), duration=1200.0, warmup=300.0, trace_dir=None)
jobs = [job_for(c, int(s), args) for s in seeds.split(",") for c in parse_cells(cells)]
run_grid(jobs, Path(out), 1)
