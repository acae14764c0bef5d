#!/usr/bin/env bash
# A/B two builds of courier-bench on this noisy machine: the working tree against a git revision,
# run in turns, so that both see the same drifts of the host's speed.
#
#   bash scripts/ab.sh REV ROUNDS -- <courier-bench arguments>
#   bash scripts/ab.sh HEAD~1 3 -- chan --case mpmc_bounded1 --samples 9
#
# Prints, per round and build, the time rows (`*_ns`, medians) of every subject. The baseline
# is built from a `git worktree` of REV into its own target directory (`target/ab-base`): a
# baseline built into `target/` itself can leave the working tree's binary stale, because cargo
# then considers the working tree's build fresh.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] && [ "$3" = "--" ] || {
    echo "usage: $0 REV ROUNDS -- <courier-bench arguments>" >&2
    exit 2
}
rev=$1 rounds=$2
shift 3
root=$(pwd)
base_dir=$(mktemp -d /tmp/courier-ab.XXXXXX)
trap 'git -C "$root" worktree remove --force "$base_dir/src" >/dev/null 2>&1 || true; rm -rf "$base_dir"' EXIT

git worktree add --detach "$base_dir/src" "$rev" >/dev/null
(cd "$base_dir/src" && CARGO_TARGET_DIR="$root/target/ab-base" cargo build --release -p courier-bench -q)
cp "$root/target/ab-base/release/courier-bench" "$base_dir/base"
cargo build --release -p courier-bench -q
cp target/release/courier-bench "$base_dir/work"

for round in $(seq 1 "$rounds"); do
    for build in base work; do
        echo "== round $round, $build ($([ $build = base ] && echo "$rev" || echo "working tree"))"
        "$base_dir/$build" "$@" 2>&1 | grep -E '^\S+ +\S+ +\S*_ns ' | grep -vE '_(p99|cpu)_ns' || true
    done
done
