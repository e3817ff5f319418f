#!/usr/bin/env bash
# The scheduler comparison of the execution-core issue: sequential against
# every scheduler at 1 and 2 workers, light and moderate cost, 0 %, 15 % and
# 50 % writes, on the key-value store (readers-writers) and the list.
# Builds in release; prints one table per configuration. Extra arguments go
# to every `psmr sched-bench` call (e.g. --json, --seed 7).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/psmr/target}"
cargo build --release -q -p psmr
psmr="$CARGO_TARGET_DIR/release/psmr"
for service in kv list; do
    for cost in light moderate; do
        commands=1000000
        [ "$cost" = moderate ] && commands=200000
        for writes in 0 15 50; do
            "$psmr" sched-bench --service "$service" --cost "$cost" --write-pct "$writes" \
                --workers 1,2 --commands "$commands" "$@"
            echo
        done
    done
done
