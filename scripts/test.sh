#!/usr/bin/env bash
# The test command of the README: every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
# Feature `async` of courier on its own (the workspace run has it through courier-bench): the
# library's unit tests and the stream's suite under tokio.
cargo test -p courier --features async --lib --test asynch
# The ipc suites again with the shared-memory ring off (COURIER_IPC_RING=0: every message through
# the socket, as ipc-channel's), the path the run above leaves untested; tests/ipc_ring.rs runs
# each of its tests both ways itself. `--features async` as above, so courier is not rebuilt.
COURIER_IPC_RING=0 cargo test -p courier --features async --test ipc --test ipc_limits \
    --test ipc_backpressure --test ipc_fd --test ipc_shmem --test ipc_select --test ipc_xprocess \
    --test ipc_death
# loom models of courier::chan (a preemption bound of 2: about 2 minutes to build and run on
# 2 cores, most of it building the dependencies with --cfg loom).
bash scripts/loom.sh
