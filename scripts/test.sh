#!/usr/bin/env bash
# The test command of the README: every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
# Feature `async` of courier on its own (the workspace run has it through courier-bench): the
# library's unit tests and the stream's suite under tokio.
cargo test -p courier --features async --lib --test asynch
# loom models of courier::chan (a preemption bound of 2: about 2 minutes to build and run on
# 2 cores, most of it building the dependencies with --cfg loom).
bash scripts/loom.sh
