#!/usr/bin/env bash
# The test command of the README: every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
