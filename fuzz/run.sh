#!/usr/bin/env bash
# Run every fuzz target for SECONDS each (default 30), N at a time (default 1).
#   fuzz/run.sh 30        # CI smoke
#   fuzz/run.sh 600 2     # the 10-minute runs, two at a time
# Each target's figures (executions, seconds, coverage, corpus) go to target/logs/summary.tsv, one
# line per target, for docs/fuzzing.md. FUZZ_KEEP=1 merges the inputs that add coverage into the
# committed seeds (corpus/<target>, libFuzzer -merge=1): the corpora that grew are kept.
# New inputs go to fuzz/target/corpus/<target> (not committed); the seeds in fuzz/corpus/<target>
# are read too. Needs cargo-fuzz (`cargo install cargo-fuzz`); runs on stable Rust with
# `-s none` (no sanitizer: Rust's own checks and panics are what the targets assert on).
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-30}
par=${2:-1}
# FUZZ_TARGETS="a b": only those (default: every target in Cargo.toml); FUZZ_SUMMARY: the
# summary file (default target/logs/summary.tsv), for two runs side by side.
targets=${FUZZ_TARGETS:-$(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^gpupass-fuzz$')}
summary=${FUZZ_SUMMARY:-target/logs/summary.tsv}
cargo fuzz build -s none >/dev/null
mkdir -p target/logs
printf 'target\texecutions\tseconds\tcov\tft\tcorpus(entries/bytes)\tseed_files\n' > "$summary"
fail=0
# target, executions, seconds, cov (edges), ft (features), corpus entries and bytes at the end,
# seed files: libFuzzer's own final counters (-print_final_stats and its last status line).
summarize() {
  local t=$1 log=target/logs/$1.log
  local runs secs last
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  secs=$(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$log" | tail -1 | awk '{print $5}' || true)
  last=$(grep -E '^#[0-9]+' "$log" | grep ' cov: ' | tail -1 || true)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$runs" "$secs" \
    "$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")" \
    "$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")" \
    "$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")" \
    "$(find "corpus/$t" -type f | wc -l)" >> "$summary"
}
run_one() {
  local t=$1 work=target/corpus/$1
  mkdir -p "$work"
  if cargo fuzz run -s none "$t" "$work" "corpus/$t" -- -max_total_time="$secs" -print_final_stats=1 \
      > "target/logs/$t.log" 2>&1; then
    echo "PASS $t: $(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "target/logs/$t.log" | tail -1)"
    summarize "$t"
    if [ "${FUZZ_KEEP:-0}" = 1 ]; then
      cargo fuzz run -s none "$t" "corpus/$t" "$work" -- -merge=1 > "target/logs/$t.merge.log" 2>&1
    fi
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
