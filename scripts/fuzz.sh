#!/usr/bin/env bash
# The cargo-fuzz targets of fuzz/ (nightly, AddressSanitizer): replays the committed seed corpus
# of each target, then fuzzes it for FUZZ_SECONDS (30 by default) starting from that corpus.
# New inputs go to a scratch directory, never into fuzz/corpus/; a crash fails the run and
# leaves its input in fuzz/artifacts/<target>/ (make it a test in courier/tests/, then fix it).
# The seed corpus is recorded from real senders: `cargo run --manifest-path fuzz/Cargo.toml
# --example seeds`.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
seconds="${FUZZ_SECONDS:-30}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
cargo +nightly fuzz build
for target in $(cargo +nightly fuzz list); do
    cargo +nightly fuzz run "$target" "fuzz/corpus/$target" -- -runs=0
    mkdir -p "$scratch/$target"
    cargo +nightly fuzz run "$target" "$scratch/$target" "fuzz/corpus/$target" -- \
        -max_total_time="$seconds" -max_len=8192 -timeout=10
done
