"""The headline JSONL with the planner's policies rerun: reactive, hot-fanout and everywhere do
not run the planner, so a planner change leaves them as they were; this takes them from BASE and
``predictive`` and ``clairvoyant`` from the reruns, and forms ``oracle`` (the hindsight bound) as
``controlplane/sim/runner.py`` does: the better of the two by p99, then mean.
Usage: python docs/sim-issue20/merge_rerun.py BASE.jsonl OUT.jsonl RERUN.jsonl [RERUN.jsonl ...]
then ``prewarm-sim grid ... --jsonl OUT.jsonl --summarize-only`` tables it."""

import json
import sys

from controlplane.sim.runner import BOUND_OF

base_path, out_path, *reruns = sys.argv[1:]
new: dict[tuple[str, int], dict] = {}
for path in reruns:
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            new.setdefault((r["cell"], r["seed"]), {}).update(r["policies"])
kept = 0
with open(out_path, "w") as out:
    for line in open(base_path):
        if not line.strip():
            continue
        r = json.loads(line)
        got = new.get((r["cell"], r["seed"]), {})
        if not all(p in got for p in BOUND_OF):
            continue  # not rerun: left out, not mixed
        pols = dict(r["policies"])
        pols["predictive"] = got["predictive"]
        best = min(BOUND_OF, key=lambda n: (got[n]["ttft_p99_s"], got[n]["ttft_mean_s"]))
        pols["oracle"] = {**got[best], "bound_of": list(BOUND_OF), "bound_chosen": best}
        out.write(json.dumps({**r, "policies": pols}) + "\n")
        kept += 1
print(f"{kept} seed(s) merged into {out_path}")
