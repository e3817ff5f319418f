# Shared by the cluster benchmarks: builds psmr in release and starts or
# stops a local cluster. Source it; it sets `psmr` and `out` (a temporary
# directory removed on exit, with any cluster still running).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/psmr/target}"
cargo build --release -q -p psmr
psmr="$CARGO_TARGET_DIR/release/psmr"
out=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT

# start_cluster NAME [psmr cluster flags...]: starts 3 replicas and sets
# `addrs` (their client addresses, comma-separated) and `cluster_pid`;
# `psmr client` acts as the admin the cluster made.
start_cluster() {
    local name=$1
    shift
    "$psmr" cluster --replicas 3 --data-dir "$out/$name" "$@" >"$out/$name.out" &
    cluster_pid=$!
    for _ in $(seq 100); do
        [ "$(grep -c listening "$out/$name.out" || true)" -eq 3 ] && break
        sleep 0.1
    done
    addrs=$(grep -o 'listening on [^ ]*' "$out/$name.out" | awk '{print $3}' | paste -sd, -)
    export PSMR_USER=admin PSMR_PASSWORD_FILE="$out/$name/admin.password"
}

# stop_cluster: stops the cluster started last.
stop_cluster() {
    kill -TERM "$cluster_pid"
    wait "$cluster_pid" || true
}
