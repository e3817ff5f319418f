#!/usr/bin/env bash
# psmr's whole test suite: formatting, lints, every unit, property,
# integration and differential test, and the loom models.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/target-dir.sh
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

scripts/setup.sh

echo "== cargo fmt"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings
echo "== cargo doc"
# Broken links in the documentation fail the run (the crate docs open with
# the example, whose code the doc tests compile).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
echo "== cargo test"
# A deadlock in a scheduler must fail the run, not hang it.
timeout 1800 cargo test --workspace --all-features
echo "== loom models"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="$CARGO_TARGET_DIR-loom" \
    cargo test -p psmr-sched --no-default-features --test loom_barrier --test loom_cycles --test loom_steal --test loom_semi --test loom_signal --test loom_gate --test loom_dag --release
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="$CARGO_TARGET_DIR-loom" \
    cargo test -p psmr-rt --test loom_rt --release
