# Sourced by the scripts that build: keeps cargo's build products outside the
# checkout (reruns are fast, clean clones stay clean) and bounded on disk.
# Every checkout path builds its own copy of the workspace crates into the
# shared directory, so clones accumulate; past PSMR_TARGET_MAX_GB (30 by
# default) the debug products are dropped and rebuilt.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/psmr/target}"
psmr_target_max_gb="${PSMR_TARGET_MAX_GB:-30}"
if [ -d "$CARGO_TARGET_DIR/debug" ]; then
    used_kb=$(du -sk "$CARGO_TARGET_DIR" | cut -f1)
    if [ "$used_kb" -gt $((psmr_target_max_gb * 1024 * 1024)) ]; then
        echo "== $CARGO_TARGET_DIR holds $((used_kb / 1024 / 1024)) GiB (over ${psmr_target_max_gb}): dropping its debug builds"
        rm -rf "$CARGO_TARGET_DIR/debug" "$CARGO_TARGET_DIR-loom"
    fi
fi
