#!/usr/bin/env bash
# Run every fuzz target for SECONDS each (default 30), N at a time (default 1).
#   fuzz/run.sh 30        # CI smoke
#   fuzz/run.sh 600 2     # the 10-minute runs, two at a time
# New inputs go to fuzz/target/corpus/<target> (not committed); the seeds in fuzz/corpus/<target>
# are read too. Needs cargo-fuzz (`cargo install cargo-fuzz`); runs on stable Rust with
# `-s none` (no sanitizer: Rust's own checks and panics are what the targets assert on).
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-30}
par=${2:-1}
targets=$(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^gpupass-fuzz$')
cargo fuzz build -s none >/dev/null
mkdir -p target/logs
fail=0
run_one() {
  local t=$1 work=target/corpus/$1
  mkdir -p "$work"
  if cargo fuzz run -s none "$t" "$work" "corpus/$t" -- -max_total_time="$secs" -print_final_stats=1 \
      > "target/logs/$t.log" 2>&1; then
    echo "PASS $t: $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "target/logs/$t.log" | tail -1)"
  else
    echo "FAIL $t: see fuzz/target/logs/$t.log and fuzz/artifacts/$t/"
    tail -20 "target/logs/$t.log"
    return 1
  fi
}
pids=()
for t in $targets; do
  run_one "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$par" ]; then
    wait "${pids[0]}" || fail=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || fail=1; done
exit $fail
