#!/usr/bin/env bash
# Installs what psmr needs beyond the base toolchains (Rust, gcc, cmake) and
# checks that those are there. Safe to run again: it only installs what is
# missing. Called by scripts/test.sh; run it by hand before the first build
# on a new machine if you like.
set -euo pipefail

missing=()
for tool in cargo rustc cc cmake; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "psmr setup: missing base tools: ${missing[*]} (install Rust with rustup, gcc and cmake first)" >&2
    exit 1
fi
for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        echo "psmr setup: the Rust component $component is missing: rustup component add $component" >&2
        exit 1
    fi
done

# System packages later parts of psmr build against go here, installed only
# when absent (Debian/Ubuntu). Nothing is needed yet.
apt_packages=()
need=()
for pkg in "${apt_packages[@]}"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi
