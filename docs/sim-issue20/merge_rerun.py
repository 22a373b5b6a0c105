"""The headline JSONL with some policies rerun: the policies a rerun holds replace BASE's, the
others (those the change does not touch: a planner change leaves reactive, hot-fanout and
everywhere as they were; a change to the fair reactive rule leaves hot-fanout and everywhere)
are kept. Where a rerun holds ``predictive`` and ``clairvoyant`` but no ``oracle``, the hindsight
bound is formed as ``controlplane/sim/runner.py`` does: the better of the two by p99, then mean.
A seed a rerun lacks is left out, not mixed.
Usage: python docs/sim-issue20/merge_rerun.py BASE.jsonl OUT.jsonl RERUN.jsonl [RERUN.jsonl ...]
then ``prewarm-sim grid ... --jsonl OUT.jsonl --summarize-only`` tables it."""

import json
import sys

# The old hindsight bound these records hold (no longer a simulator policy).
BOUND_OF = ("clairvoyant", "predictive")

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
        got = new.get((r["cell"], r["seed"]))
        if not got:
            continue
        if "oracle" not in got and all(p in got for p in BOUND_OF):
            best = min(BOUND_OF, key=lambda n: (got[n]["ttft_p99_s"], got[n]["ttft_mean_s"]))
            got["oracle"] = {**got[best], "bound_of": list(BOUND_OF), "bound_chosen": best}
        pols = {name: got.get(name, old) for name, old in r["policies"].items()}
        out.write(json.dumps({**r, "policies": pols}) + "\n")
        kept += 1
print(f"{kept} seed(s) merged into {out_path}")
