#!/usr/bin/env bash
# Start-up of the short commands, side by side in one run (docs/performance.md, "Start-up"):
#
#   benches/startup.sh [N]              # N runs of each contender, 30 by default
#
# Builds what users install: `cargo build --release` (target/release/gpupass, what the README
# and `cargo install` build) and the package's static binary (contrib/package.sh --bin-only:
# target/package/gpupass-<version>-x86_64-linux). Then runs, alternating one run of each
# contender per round (the order rotating from round to round, after one unmeasured warm-up run
# of each):
#   - `gpupass --version` of each build,
#   - `gpupass oci-hook` of each build on a no-op OCI state (a container without the
#     gpupass.dev/devices annotation: what the hook does at most container starts),
#   - Debian's `mdevctl --version` (tests/install-deps.sh installs it),
#   - `/bin/true` (the floor: one process that does nothing).
# Per run: wall time (fork to reap, CLOCK_MONOTONIC) and minor page faults (the child's
# rusage from wait4, what `/usr/bin/time -f %R` prints). Then, once per contender, the
# instructions it executes in user space (`valgrind --tool=callgrind`: `perf stat -e
# instructions` is not supported on this kind of VM). The load average is printed before and
# after. Everything printed also goes to target/startup/startup.txt.
#
# STARTUP_NO_BUILD=1 measures the binaries already built; STARTUP_EXTRA="LABEL=PATH ..." adds
# more gpupass binaries (e.g. a build of an earlier commit) as contenders.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-30}
tdir=${CARGO_TARGET_DIR:-target}
out=$tdir/startup
mkdir -p "$out"
out=$(cd "$out" && pwd)
for t in python3 valgrind mdevctl; do
  command -v $t >/dev/null || { echo "benches/startup.sh: $t is missing (run tests/install-deps.sh)" >&2; exit 1; }
done
if [ -z "${STARTUP_NO_BUILD:-}" ]; then
  cargo build --release --bin gpupass >&2
  contrib/package.sh --bin-only >&2
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
bins=("release=$tdir/release/gpupass" "package=$tdir/package/gpupass-$version-x86_64-linux")
for e in ${STARTUP_EXTRA:-}; do bins+=("$e"); done

# The no-op OCI state: a bundle whose config.json names no device.
mkdir -p "$out/bundle"
echo '{"ociVersion":"1.2.0","annotations":{}}' >"$out/bundle/config.json"
printf '{"ociVersion":"1.2.0","id":"startup","status":"creating","pid":1,"bundle":"%s","annotations":{}}' \
  "$out/bundle" >"$out/state.json"

{
  echo "benches/startup.sh $n at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src Cargo.toml || echo +changes), $(date -u +%FT%TZ)"
  echo "load average before: $(cat /proc/loadavg)"
  for b in "${bins[@]}"; do
    p=${b#*=}
    echo "  ${b%%=*}: $p, $(stat -c %s "$p") bytes, $(file -b "$p" | cut -d, -f1-2,5)"
  done
} | tee "$out/startup.txt"

args=()
for b in "${bins[@]}"; do
  args+=("${b%%=*} --version" "${b#*=} --version")
done
args+=("mdevctl --version" "/usr/bin/mdevctl --version" "/bin/true" "/bin/true")
for b in "${bins[@]}"; do
  args+=("${b%%=*} oci-hook" "${b#*=} oci-hook")
done

python3 - "$n" "$out/state.json" "${args[@]}" <<'EOF' | tee -a "$out/startup.txt"
import os, re, statistics, subprocess, sys, time
n, state = int(sys.argv[1]), sys.argv[2]
pairs = sys.argv[3:]
contenders = [(pairs[i], pairs[i + 1].split()) for i in range(0, len(pairs), 2)]
devnull = os.open(os.devnull, os.O_RDWR)

def run(argv):
    """One run: wall ns, minor faults, exit status (stdin: the OCI state for oci-hook)."""
    stdin = os.open(state, os.O_RDONLY) if "oci-hook" in argv else devnull
    t0 = time.perf_counter_ns()
    pid = os.posix_spawn(argv[0], argv, os.environ,
                         file_actions=[(os.POSIX_SPAWN_DUP2, stdin, 0),
                                       (os.POSIX_SPAWN_DUP2, devnull, 1)])
    _, status, ru = os.wait4(pid, 0)
    t1 = time.perf_counter_ns()
    if stdin != devnull:
        os.close(stdin)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"{' '.join(argv)} exited {os.waitstatus_to_exitcode(status)}")
    return t1 - t0, ru.ru_minflt

for _, argv in contenders:  # warm-up: page cache, dentries
    run(argv)
wall = {c: [] for c, _ in contenders}
faults = {c: [] for c, _ in contenders}
for r in range(n):
    k = r % len(contenders)
    for label, argv in contenders[k:] + contenders[:k]:
        w, f = run(argv)
        wall[label].append(w)
        faults[label].append(f)

def instructions(argv):
    """User-space instructions by callgrind (its 'Collected' total of Ir)."""
    p = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"] + argv,
                       stdin=open(state) if "oci-hook" in argv else subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    m = re.search(r"Collected : (\d+)", p.stderr)
    return int(m.group(1)) if m else None

floor = statistics.median(wall["/bin/true"])
ref = statistics.median(wall["mdevctl --version"])
print(f"{n} alternating runs each; wall in ms (median, mean, min), minor faults (median), "
      "instructions (callgrind, one run); ratios of the median wall")
print(f"{'contender':<28} {'median':>7} {'mean':>7} {'min':>7} {'faults':>7} {'instr':>11} "
      f"{'/mdevctl':>9} {'/true':>7}")
for label, argv in contenders:
    w = wall[label]
    med = statistics.median(w)
    ins = instructions(argv)
    print(f"{label:<28} {med/1e6:7.2f} {statistics.mean(w)/1e6:7.2f} {min(w)/1e6:7.2f} "
          f"{statistics.median(faults[label]):7.0f} {ins if ins is not None else '?':>11} "
          f"{med/ref:8.2f}x {med/floor:6.2f}x")
EOF
echo "load average after: $(cat /proc/loadavg)" | tee -a "$out/startup.txt"
