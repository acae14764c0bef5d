#!/usr/bin/env bash
# Miri (nightly) over the tests of chan and buf, the modules whose unsafe code is memory-model
# work (lock-free slots, spare capacity, iovec casts), and over the ipc transport contract's
# conformance suite run against the in-process twin (raw copies into iovecs, shared mappings
# of heap memory): undefined behaviour fails the run. The
# suites shrink under cfg(miri) (`if cfg!(miri) { .. } else { .. }` sizes).
#
# Not run under Miri, and why:
# - tests/chan_fibers.rs: its scheduler switches stacks with corosensei, inline assembly that
#   Miri cannot interpret;
# - tests/chan_loom.rs: loom models, built only with `--cfg loom` (scripts/loom.sh runs them);
# - tests/buf_socket.rs: sockets (socketpair, sendmsg/recvmsg into iovecs), system calls Miri
#   does not implement;
# - every other ipc test, and every fiber test: sockets, epoll, memfd regions mapped with mmap,
#   futexes on shared memory, fork and re-executed child processes, none of which Miri can run;
# - tests/chan_stress.rs's a_panicking_park_aborts_the_process and tests/buf.rs's
#   fill_spare_grows_by_filled (below).
# Isolation is off so that proptest can look for its persisted failures and threads can sleep
# on the host clock.
set -euo pipefail
cd "$(dirname "$0")/.."
rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^miri' \
    || rustup component add miri rust-src --toolchain nightly
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-disable-isolation}"
# tests/buf.rs takes its proptest case count from the environment (256 by default).
export PROPTEST_CASES="${PROPTEST_CASES:-8}"
cargo +nightly miri test -p courier --lib -- chan:: buf:: ipc::platform::conformance::twin
# fill_spare_grows_by_filled leaks a buffer on purpose (`Box::leak`, for a 'static slice to swap
# in), which Miri's leak check reports; the rest of tests/buf.rs runs.
cargo +nightly miri test -p courier --test buf -- --skip fill_spare_grows_by_filled
# The chan suite (46 tests, about 2.5 minutes under Miri on 2 cores).
cargo +nightly miri test -p courier --test chan
# `--ci`: the above only (about 11 minutes on 2 cores, what .ci/run can afford). Without it, the
# stress and property suites too, which take Miri 10 minutes and more.
[ "${1:-}" = "--ci" ] && exit 0
# a_panicking_park_aborts_the_process re-executes the test binary (posix_spawn), which Miri
# cannot do.
cargo +nightly miri test -p courier --no-fail-fast --test chan_stress --test chan_prop \
    -- --skip a_panicking_park_aborts_the_process
