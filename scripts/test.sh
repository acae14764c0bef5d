#!/usr/bin/env bash
# The test command of the README: every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
# loom models of courier::chan (a preemption bound of 2: about 2 minutes to build and run on
# 2 cores, most of it building the dependencies with --cfg loom).
bash scripts/loom.sh
