#!/usr/bin/env bash
# The replicated cluster's throughput and latency (the replicated-cluster
# issue): a local 3-replica kv cluster, `sequential` against `early` (2
# workers), 1, 8 and 64 closed-loop clients sending 1 or 50 commands per
# request (50 % puts, 10k keys), and how busy each replica thread was.
# Builds in release. Extra arguments go to every `psmr client load` call
# (e.g. --duration 10, --json).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/psmr/target}"
cargo build --release -q -p psmr
psmr="$CARGO_TARGET_DIR/release/psmr"
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT
for scheduler in sequential early; do
    "$psmr" cluster --replicas 3 --scheduler "$scheduler" --workers 2 --storage "${PSMR_STORAGE:-memory}" --data-dir "$out/$scheduler" >"$out/$scheduler.out" &
    pid=$!
    for _ in $(seq 50); do
        [ "$(grep -c listening "$out/$scheduler.out" || true)" -eq 3 ] && break
        sleep 0.1
    done
    addrs=$(grep -o 'listening on [^ ]*' "$out/$scheduler.out" | awk '{print $3}' | paste -sd, -)
    for clients in 1 8 64; do
        for per in 1 50; do
            echo "== $scheduler, $clients clients, $per commands per request"
            "$psmr" client --cluster "$addrs" load --clients "$clients" --per-request "$per" "$@"
        done
    done
    kill -TERM "$pid"
    wait "$pid" || true
done
