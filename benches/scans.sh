#!/bin/sh
# How many times one request reads the host: the full scans (inventory::scan) and the group
# scans (inventory::scan_groups) of a `gpupass bind` with the CDI refresh that follows it,
# and of a DRA Prepare and Unprepare, on a fake-kernel host where a CDI spec is recorded (so
# the refresh runs). The test kit counts them per thread (inventory::counted);
# src/containers/cdi/tests.rs makes each request once (docs/performance.md, "Host reads per
# request").
#   benches/scans.sh            this tree
#   benches/scans.sh --before   the tree before the engine change (9eecfb21), with the same
#                               counter and the same requests through its API
#                               (benches/scans/before.rs), in a temporary worktree
set -eu
cd "$(dirname "$0")/.."
filter=containers::cdi::tests
if [ "${1:-}" = --before ]; then
    base=9eecfb21
    # The counter as it landed (inventory/mod.rs was otherwise unchanged since $base).
    counter=$(git log -1 --format=%H -S'pub mod counted' -- src/inventory/mod.rs)
    tmp=$(mktemp -d)
    git worktree add -q --detach "$tmp/before" "$base"
    trap 'git worktree remove --force "$tmp/before"; rm -rf "$tmp"' EXIT
    git show "$counter:src/inventory/mod.rs" >"$tmp/before/src/inventory/mod.rs"
    cp benches/scans/before.rs "$tmp/before/src/scans_before.rs"
    printf '\n#[cfg(test)]\nmod scans_before;\n' >>"$tmp/before/src/lib.rs"
    # A target directory of its own: cargo hashes the two trees' crate alike, and a shared one
    # would keep the old tree's library as fresh for this one. Seeded from this tree's once.
    target=${CARGO_TARGET_DIR:-$PWD/target}
    if [ ! -d "$target/scans-before/debug" ] && [ -d "$target/debug" ]; then
        mkdir -p "$target/scans-before"
        cp -a --reflink=auto "$target/debug" "$target/scans-before/"
    fi
    export CARGO_TARGET_DIR="$target/scans-before"
    cd "$tmp/before"
    filter=scans_before
fi
cargo test --lib --features dra "$filter" -- --nocapture --test-threads=1 2>&1 | grep -o 'scans: .*'
