#!/usr/bin/env bash
# Before/after figures of the three hot paths in docs/performance.md, in one run:
#
#   benches/compare.sh [BEFORE]          # BEFORE: a git revision, default d4f46f2 (before #14)
#
# Builds gpupass at BEFORE (in a git worktree under target/compare) and from this working tree,
# both the same way: static release builds without the test kit (what contrib/install.sh
# installs, and what the QEMU lab guest can run). Then, each contender side by side with the
# other and with the tool a user would use instead:
#   1. inventory: `cargo bench --bench inventory -- callgrind` (both builds and lspci -nnk,
#      interleaved round by round; CPU time and callgrind instructions);
#   2. OCI hook: `cargo bench --bench containers hook` (both builds as the hook, interleaved;
#      needs root, unshare, nsenter and a cgroup2 mount);
#   3. bind: `lab/lab.sh run bindbench` once per build (GPUPASS_LAB_BIN), each boot comparing
#      gpupass with the shell floors and driverctl.
# Everything it prints also goes to target/compare/*.txt, with the load average before and after.
# BENCH_SKIP="inventory hook bind" leaves parts out (for a rerun of one part); BENCH_BEFORE_BIN
# names a BEFORE binary built the same way already (its checkout must be at BEFORE).
set -euo pipefail
cd "$(dirname "$0")/.."
before=${1:-d4f46f2}
out=$PWD/target/compare
mkdir -p "$out"
skip=" ${BENCH_SKIP:-} "
flags="-C target-feature=+crt-static -C relocation-model=static"

build() { # SRC_DIR TARGET_DIR -> the static binary's path on stdout
  (cd "$1" && RUSTFLAGS="$flags" cargo build --release --target x86_64-unknown-linux-gnu \
    --target-dir "$2" --bin gpupass >&2)
  echo "$2/x86_64-unknown-linux-gnu/release/gpupass"
}

wt=$out/before-src
if [ -n "${BENCH_BEFORE_BIN:-}" ]; then
  B=$BENCH_BEFORE_BIN # built from BEFORE the same way already
  wt=$(git -C "$(dirname "$B")" rev-parse --show-toplevel)
else
  if [ ! -d "$wt" ]; then
    git worktree add --detach "$wt" "$before" >&2
  fi
  git -C "$wt" checkout -q --detach "$before"
  B=$(build "$wt" "$out/before-target")
fi
A=$(build . "$out/after-target")
{
  echo "before: $before ($(git -C "$wt" rev-parse --short HEAD)) $B"
  echo "after:  $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo '+changes') $A"
  echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$out/contenders.txt"
# The release binary carries no test kit (docs/ARCHITECTURE.md, "No test machinery").
for s in GPUPASS_FAKE_KERNEL GPUPASS_FAKE_BEFORE_APPLY GPUPASS_FAIL_WRITE GPUPASS_CRASH_AFTER_WRITE FakeHost; do
  echo "strings after | grep -c $s: $(strings "$A" | grep -c "$s" || true)"
done | tee -a "$out/contenders.txt"

export GPUPASS_BENCH_BIN=$A GPUPASS_BENCH_BIN_B=$B GPUPASS_BENCH_BIN_B_NAME=$before
if [[ $skip != *" inventory "* ]]; then
  cargo bench --bench inventory -- callgrind 2>&1 | tee "$out/inventory.txt"
fi
if [[ $skip != *" hook "* ]]; then
  cargo bench --bench containers hook 2>&1 | tee "$out/hook.txt"
fi
if [[ $skip != *" bind "* ]]; then
  GPUPASS_LAB_BIN=$A lab/lab.sh run bindbench 2>&1 | tee "$out/bind-after.txt"
  GPUPASS_LAB_BIN=$B lab/lab.sh run bindbench 2>&1 | tee "$out/bind-before.txt"
  grep -h '^BENCH\|BENCH ' "$out/bind-after.txt" | sed 's/^/after:  /'
  grep -h '^BENCH\|BENCH ' "$out/bind-before.txt" | sed 's/^/before: /'
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/contenders.txt"
