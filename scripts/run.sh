#!/usr/bin/env bash
# psmr's main job on a fresh machine: installs what psmr needs beyond the
# base toolchains (scripts/setup.sh), builds the `psmr` binary in release and
# runs it with the given arguments. With none it runs `psmr bench`: the
# default scenario, every kind of scheduler end to end on local 3-replica
# clusters, with its report written to psmr-bench-out/schedulers/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/target-dir.sh
scripts/setup.sh
cargo build --release -p psmr
[ $# -gt 0 ] || set -- bench
exec "$CARGO_TARGET_DIR/release/psmr" "$@"
