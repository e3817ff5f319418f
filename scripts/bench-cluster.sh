#!/usr/bin/env bash
# The replicated cluster's throughput and latency (the replicated-cluster
# issue): a local 3-replica kv cluster, `sequential` against `early` (2
# workers), 1, 8 and 64 closed-loop clients sending 1 or 50 commands per
# request (50 % puts, 10k keys), and how busy each replica thread was.
# Storage: PSMR_STORAGE (memory by default). Builds in release. Extra
# arguments go to every `psmr client load` call (e.g. --duration 10, --json).
source "$(dirname "$0")/cluster-lib.sh"
for scheduler in sequential early; do
    start_cluster "$scheduler" --scheduler "$scheduler" --workers 2 --storage "${PSMR_STORAGE:-memory}"
    for clients in 1 8 64; do
        for per in 1 50; do
            echo "== $scheduler, $clients clients, $per commands per request"
            "$psmr" client --cluster "$addrs" load --clients "$clients" --per-request "$per" "$@"
        done
    done
    stop_cluster
done
