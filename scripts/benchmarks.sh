#!/usr/bin/env bash
# Regenerates BENCHMARKS.md and docs/bench/ipc_sendrecv.svg from one run of every
# courier-bench suite. The file is rewritten whole: never edit it by hand.
#
#   bash scripts/benchmarks.sh            quick run: about 2.5 minutes of measurement, plus the build
#   bash scripts/benchmarks.sh --full     the original benchmarks' parameters: much longer
#   bash scripts/benchmarks.sh --json F   also keep every figure as JSON records (for `compare`)
#
# Arguments go to `courier-bench document` (see `courier-bench document --help`). Run it on a
# quiet machine with the tree committed: the document records the commit it measured, and says
# so when the measured sources (courier/, courier-bench/, Cargo.toml, Cargo.lock) had
# uncommitted changes.
set -euo pipefail
cd "$(dirname "$0")/.."
# The http suite also records one run of the seed's own load tool, `ab` (Debian's
# apache2-utils), when it is installed: installed here if this is a root shell with apt.
if ! command -v ab >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing apache2-utils (ab) for the http suite's ab row" >&2
        apt-get install -y -qq apache2-utils >/dev/null 2>&1 \
            || echo "could not install apache2-utils: the ab row will be skipped" >&2
    else
        echo "ab (apache2-utils) is not installed: the http suite's ab row will be skipped" >&2
    fi
fi
cargo build --release -p courier-bench
# The binary re-executes itself for the cross-process cases: run it from the target directory
# cargo built it in (CARGO_TARGET_DIR if set).
exec "${CARGO_TARGET_DIR:-target}/release/courier-bench" document \
    --out BENCHMARKS.md --plot docs/bench/ipc_sendrecv.svg --notes docs "$@"
