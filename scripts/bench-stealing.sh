#!/usr/bin/env bash
# The comparison of 000 §7 (busy-wait and work stealing): the sharded list,
# 2 shards, light cost, workloads 0-0-0, 15-1-15, 25-5-25 and 75-10-75,
# balanced and skewed (80 % of local operations on shard 1), for `early`,
# `early-busywait` and the four work-stealing schedulers at 2 and 4
# workers. Conflicting commands are spread exponentially, as 000 §7.1 did
# for its measurements. Builds in release; prints one table per workload.
# Extra arguments go to every `psmr sched-bench` call (e.g. --repeat 3,
# --metrics, --json, --spread uniform).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/psmr/target}"
cargo build --release -q -p psmr
psmr="$CARGO_TARGET_DIR/release/psmr"
for skew in 0 0.8; do
    for workload in 0-0-0 15-1-15 25-5-25 75-10-75; do
        echo "== workload $workload, skew $skew"
        "$psmr" sched-bench --service list --model sharded-global --shards 2 --cost light \
            --workload "$workload" --skew "$skew" --spread exponential \
            --scheduler early,early-busywait,early-ws-queue,early-ws-semi,early-ws-nonblocking,early-ws-optimistic \
            --workers 2,4 --commands 1000000 "$@"
        echo
    done
done
