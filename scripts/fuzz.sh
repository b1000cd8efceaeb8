#!/usr/bin/env bash
# Runs every cargo fuzz target of fuzz/ for FUZZ_SECONDS (default 60) each, two at a time
# (FUZZ_PARALLEL), from a copy of its seed corpus in fuzz/corpus/<target>/ (the repository's corpus is not grown by CI runs).
# Installs cargo-fuzz when it is missing. Builds with RUSTC_BOOTSTRAP=1 (cargo fuzz needs
# nightly flags; the toolchain is stable) into a target folder next to CARGO_TARGET_DIR, kept
# between runs so the build is incremental. A crash fails the script; the input is left in
# fuzz/artifacts/<target>/ (docs/security.md says how it becomes a regression test).
#
#   scripts/fuzz.sh [TARGET...]      (default: every target)
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=../deploy/local/lib.sh
. deploy/local/lib.sh

seconds=${FUZZ_SECONDS:-60}
export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

export RUSTC_BOOTSTRAP=1
# A sibling of the main target folder: the sanitizer build shares nothing with it.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}-fuzz"

cd fuzz
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    mapfile -t targets < <(cargo fuzz list)
fi

log "cargo fuzz build"
cargo fuzz build
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One target's bounded run; its log in $work/<target>.log.
fuzz_one() {
    local target=$1
    mkdir -p "$work/$target"
    cp -r "corpus/$target/." "$work/$target/"
    cargo fuzz run "$target" "$work/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$work/$target.log" 2>&1
}

# FUZZ_PARALLEL targets at a time (default 2: one per core of a CI machine).
parallel=${FUZZ_PARALLEL:-2}
failed=()
for ((i = 0; i < ${#targets[@]}; i += parallel)); do
    batch=("${targets[@]:i:parallel}")
    log "fuzzing ${batch[*]} for ${seconds}s"
    pids=()
    for target in "${batch[@]}"; do
        fuzz_one "$target" &
        pids+=($!)
    done
    for j in "${!batch[@]}"; do
        target=${batch[$j]}
        if wait "${pids[$j]}"; then
            printf '%s: %s\n' "$target" "$(grep -E '^stat::(number_of_executed_units|new_units_added)' "$work/$target.log" | tr '\n' ' ')" >&2
        else
            tail -n 60 "$work/$target.log" >&2
            echo "fuzz target $target crashed: the input is in fuzz/artifacts/$target/" >&2
            failed+=("$target")
        fi
    done
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz targets that crashed: ${failed[*]}" >&2
    exit 1
fi
