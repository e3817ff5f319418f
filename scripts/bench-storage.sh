#!/usr/bin/env bash
# Disk against memory storage (the durability issue): a local 3-replica kv
# cluster (`sequential`, so that execution stays out of the way; set
# PSMR_SCHEDULER to change it), 8 and 64 closed-loop clients with 1 and 50
# commands per request (50 % puts, 10k keys). Builds in release. Extra
# arguments go to every `psmr client load` call (e.g. --duration 10).
source "$(dirname "$0")/cluster-lib.sh"
for storage in memory disk; do
    start_cluster "$storage" --scheduler "${PSMR_SCHEDULER:-sequential}" --workers 2 --storage "$storage"
    for clients in 8 64; do
        for per in 1 50; do
            echo "== $storage, $clients clients, $per commands per request"
            "$psmr" client --cluster "$addrs" load --clients "$clients" --per-request "$per" "$@" | grep 'commands/s'
        done
    done
    stop_cluster
done
