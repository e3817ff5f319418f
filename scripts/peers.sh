#!/usr/bin/env bash
# psmr next to its peers: installs etcd and Redis from the system packages
# (Debian/Ubuntu: etcd-server, redis-server, redis-tools), only when they
# are absent, then builds psmr in release and runs
# `psmr bench --scenario peers` with the given arguments (e.g. --quick, or
# --out DIR). `scripts/peers.sh --install-only` stops after the install.
# Safe to run again.
#
# The packages' own services are neither started nor left enabled: the
# scenario starts its own etcd and redis-server processes, on free loopback
# ports, with data in a temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/psmr/target}"

. scripts/apt-lib.sh
apt_install etcd-server redis-server redis-tools

for bin in etcd redis-server redis-benchmark; do
    if ! command -v "$bin" >/dev/null 2>&1; then
        echo "psmr peers: $bin is still missing after the install" >&2
        exit 1
    fi
done
echo "psmr peers: $(etcd --version | head -1); $(redis-server --version)" >&2

[ "${1:-}" != "--install-only" ] || exit 0
cargo build --release -p psmr
exec "$CARGO_TARGET_DIR/release/psmr" bench --scenario peers "$@"
