#!/usr/bin/env bash
# Runs the tests of `courier::buf` under valgrind memcheck (outside CI: slow).
#
# Shows that memory lent to the kernel or to `copy_to_iter` uninitialised is
# never read before it is written: the tests receive into fresh allocations
# (`Vec::with_capacity`, `Box::new_uninit_slice`) and compare every byte that
# arrived, so a read of an unwritten byte would make memcheck report
# "uninitialised value(s)"; `recvmsg` is checked by valgrind's syscall
# wrappers too. Any memcheck error fails the script.
#
# Usage: scripts/valgrind-buf.sh [PROPTEST_CASES, default 32]
set -euo pipefail
cd "$(dirname "$0")/.."

export PROPTEST_CASES="${1:-${PROPTEST_CASES:-32}}"
mapfile -t bins < <(
    cargo test -p courier --test buf --test buf_socket --no-run --message-format=json \
        | jq -r 'select(.reason == "compiler-artifact" and .executable != null) | .executable'
)
for bin in "${bins[@]}"; do
    echo "== valgrind memcheck: $(basename "$bin") (PROPTEST_CASES=$PROPTEST_CASES)"
    valgrind --tool=memcheck --error-exitcode=99 --track-origins=yes \
        --leak-check=no --quiet \
        "$bin" --test-threads=1
done
echo "== memcheck: no errors"
