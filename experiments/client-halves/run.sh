#!/bin/bash
# The client-halves runs: one half per call (tune or holdout), appended to <half>.jsonl and
# resumable (jobs already there are skipped). Seeds in rounds: the shipped reactive, predictive
# and the everywhere ceiling first (the comparison and the saturation rule), then the
# routing-time rule and hot fanout beside them, five seeds at a time.
#   experiments/client-halves/run.sh tune &  experiments/client-halves/run.sh holdout &
set -eu
half=$1
cd "$(dirname "$0")/../.."
CELLS=servegen:llama3-70b:scaleout,servegen:llama3-70b:slowlink
grid() {
    PYTHONPATH=$PWD .venv/bin/prewarm-sim grid --cells $CELLS --clients "$half" \
        --duration 1200 --runs-only --workers 1 \
        --jsonl "experiments/client-halves/$half.jsonl" "$@"
}
for seeds in 0,1,2,3,4 5,6,7,8,9 10,11,12,13,14 15,16,17,18,19; do
    grid --seeds $seeds --policies reactive,predictive,everywhere
    grid --seeds $seeds --policies routing-reactive,hot-fanout
done
