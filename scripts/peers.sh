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

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

# Package -> a binary it provides, to tell whether it is there.
declare -A provides=([etcd-server]=etcd [redis-server]=redis-server [redis-tools]=redis-benchmark)
need=()
for pkg in etcd-server redis-server redis-tools; do
    dpkg -s "$pkg" >/dev/null 2>&1 || command -v "${provides[$pkg]}" >/dev/null 2>&1 || need+=("$pkg")
done

if [ ${#need[@]} -gt 0 ]; then
    # A policy-rc.d that answers 101 ("action not allowed") keeps the
    # packages' maintainer scripts from starting their services (the
    # Debian way, honoured by invoke-rc.d and deb-systemd-invoke). One
    # that is already there is the machine's own: leave it alone.
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
        $sudo chmod 755 "$policy"
        trap '$sudo rm -f "$policy"' EXIT
    fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"
    # The packages enable their units for the next boot: the scenario does
    # not need them. Under a running systemd they are stopped too (they
    # were not started, unless the policy above is the machine's own and
    # allows it); without one, systemctl edits the unit links offline.
    if command -v systemctl >/dev/null 2>&1; then
        now=""
        [ ! -d /run/systemd/system ] || now="--now"
        for pkg in "${need[@]}"; do
            case "$pkg" in
                etcd-server) $sudo systemctl disable $now etcd >/dev/null 2>&1 || true ;;
                redis-server) $sudo systemctl disable $now redis-server >/dev/null 2>&1 || true ;;
            esac
        done
    fi
fi

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
