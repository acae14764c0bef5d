#!/usr/bin/env bash
# loom models of courier::chan (courier/tests/chan_loom.rs), bounded so CI can afford them:
# a preemption bound of 2 (override with LOOM_MAX_PREEMPTIONS) keeps the run to a few minutes
# on 2 cores. loom builds go to their own target directory: `--cfg loom` changes every crate.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="${RUSTFLAGS:-} --cfg loom"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom"
cargo test -p courier --release --test chan_loom -- --test-threads=1 "$@"
# How a fiber's result meets its joiner (courier/src/fiber/join.rs).
cargo test -p courier --release --lib -- fiber::join --test-threads=1 "$@"
