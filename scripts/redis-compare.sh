#!/usr/bin/env bash
# redis-benchmark against a 3-replica psmr kv cluster's Redis port and
# against one unreplicated redis-server (no persistence), in one run, with
# the ratios: the comparison docs/redis.md reports.
#
#   bash scripts/redis-compare.sh [SCHEDULER] [STORAGE]   # default: sequential memory
#
# Installs Redis through scripts/peers.sh --install-only when it is absent,
# builds psmr in release, and leaves nothing running. Both systems share
# this machine's cores with redis-benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/psmr/target}"
scheduler="${1:-sequential}"
storage="${2:-memory}"

command -v redis-server >/dev/null 2>&1 && command -v redis-benchmark >/dev/null 2>&1 ||
    bash scripts/peers.sh --install-only
cargo build --release -q -p psmr
psmr="$CARGO_TARGET_DIR/release/psmr"

work="$(mktemp -d)"
cleanup() {
    [ -z "${cluster_pid:-}" ] || kill "$cluster_pid" 2>/dev/null || true
    [ -z "${redis_pid:-}" ] || kill "$redis_pid" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

workers=2
[ "$scheduler" != sequential ] || workers=1
# Without users, as the redis-server it is compared with.
"$psmr" cluster --redis --insecure-clients --storage "$storage" --scheduler "$scheduler" --workers "$workers" \
    --data-dir "$work/psmr" >"$work/cluster.out" 2>"$work/cluster.err" &
cluster_pid=$!
for _ in $(seq 100); do
    grep -q "replica 3 redis" "$work/cluster.err" 2>/dev/null && break
    sleep 0.1
done
psmr_port="$(grep -m1 "replica 1 redis" "$work/cluster.err" | awk '{print $NF}')"
[ -n "$psmr_port" ] || { cat "$work/cluster.err" >&2; exit 1; }
until redis-cli -p "$psmr_port" set warm up >/dev/null 2>&1; do sleep 0.1; done

redis_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
    >"$work/redis.log" 2>&1 &
redis_pid=$!
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.1; done

# Every test redis-benchmark drives that psmr serves: each type's.
tests="set,get,incr,lpush,rpush,lpop,rpop,sadd,hset,spop,zadd,zpopmin,lrange_100,mset"

# The tests of redis-benchmark's CSV, in order, and the rps of TEST.
names() { awk -F'","' 'NR > 1 { gsub(/^"/, "", $1); print $1 }' "$1"; }
rps() { awk -F'","' -v t="$2" '{ n = $1; gsub(/^"/, "", n) } n == t { print $2 }' "$1"; }

echo "psmr: 3 replicas, $storage storage, scheduler $scheduler ($workers workers); redis-server $(redis-server --version | awk '{print $3}')"
printf '%-22s %-42s %12s %12s %7s\n' "redis-benchmark" test "psmr req/s" "redis req/s" ratio
for args in "-n 200000 -c 64" "-n 2000000 -c 8 -P 50"; do
    psmr_n="${args/2000000/400000}"
    psmr_n="${psmr_n/200000/50000}"
    # shellcheck disable=SC2086
    redis-benchmark -p "$psmr_port" -t "$tests" $psmr_n --csv >"$work/psmr.csv" 2>/dev/null
    # shellcheck disable=SC2086
    redis-benchmark -p "$redis_port" -t "$tests" $args --csv >"$work/redis.csv" 2>/dev/null
    while IFS= read -r t; do
        p="$(rps "$work/psmr.csv" "$t")"
        r="$(rps "$work/redis.csv" "$t")"
        [ -n "$p" ] && [ -n "$r" ] || continue
        printf '%-22s %-42s %12s %12s %7s\n' "${args#-n * }" "$t" "$p" "$r" \
            "$(awk -v p="$p" -v r="$r" 'BEGIN { printf "%.3f", p / r }')"
    done < <(names "$work/psmr.csv")
done
