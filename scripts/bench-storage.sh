#!/usr/bin/env bash
# Disk against memory storage (the durability issue): a local 3-replica kv
# cluster (`sequential`, so that execution stays out of the way; set
# PSMR_SCHEDULER to change it), 8 and 64 closed-loop clients with 1 and 50
# commands per request (50 % puts, 10k keys). Builds in release. Extra
# arguments go to every `psmr client load` call (e.g. --duration 10).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/psmr/target}"
cargo build --release -q -p psmr
psmr="$CARGO_TARGET_DIR/release/psmr"
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT
for storage in memory disk; do
    "$psmr" cluster --replicas 3 --scheduler "${PSMR_SCHEDULER:-sequential}" --workers 2 --storage "$storage" --data-dir "$out/$storage" \
        >"$out/$storage.out" &
    pid=$!
    for _ in $(seq 50); do
        [ "$(grep -c listening "$out/$storage.out" || true)" -eq 3 ] && break
        sleep 0.1
    done
    addrs=$(grep -o 'listening on [^ ]*' "$out/$storage.out" | awk '{print $3}' | paste -sd, -)
    for clients in 8 64; do
        for per in 1 50; do
            echo "== $storage, $clients clients, $per commands per request"
            "$psmr" client --cluster "$addrs" load --clients "$clients" --per-request "$per" "$@" | grep 'commands/s' 
        done
    done
    kill -TERM "$pid"
    wait "$pid" || true
done
