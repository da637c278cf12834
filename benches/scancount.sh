#!/usr/bin/env bash
# How many times one request reads the host, counted by the kernel's own record of what the
# real binary did (strace), not by gpupass's bookkeeping (docs/performance.md, "Host reads per
# request, counted with strace"). On a copy of tests/fixtures/hosts/qemu-lab under the test
# kit's fake kernel (GPUPASS_FAKE_KERNEL=1: a write takes the kernel's visible effect on the
# tree), with the edu device (00:06.0) bound and a CDI spec written first (`cdi generate
# --write`, so the refresh after a change runs), the lab's VGA+audio group 4 (00:05.0 + 00:05.1):
#   - `gpupass bind 0000:00:05.0`, then `gpupass unbind 0000:00:05.0`, each a process of its own;
#   - `gpupass dra-plugin --claims-dir` (no API server: nothing published, but the worker reads
#     the pool and health after every call just the same), a NodePrepareResources and then a
#     NodeUnprepareResources of a claim for pci-0000-00-05-0 made the kubelet's way on its
#     socket (examples/kubelet_call.rs), each counted from the call to 1.5 s after its reply
#     (the worker's refresh after it; the poll is set to 10 s, so no poll falls in between).
# What is counted, per request:
#   full    listings of sys/bus/pci/devices read to their end (getdents64 returning 0 on it):
#           one per inventory::scan (the whole host), which reads every function;
#   reads   the inventory reader's reads of the VGA function (its `modalias`, opened relative
#           to the function's directory, the identity every read starts with): one per
#           inventory read that includes that function, a full scan or a group scan
#           (inventory::scan_groups);
#   groups  reads - full: the group scans;
#   listing listings of sys/kernel/iommu_groups/4/devices to their end: the group scans, the
#           re-check before the writes, the engine's viability check and the claim's holds.
#
#   benches/scancount.sh [GPUPASS [KUBELET_CALL]]
# The binaries default to target/debug/gpupass (built with --features dra,testkit) and
# target/debug/examples/kubelet_call, built here when absent. Output: one line per request, and
# the traces under target/scancount/.
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD
gp=${1:-$here/target/debug/gpupass}
kc=${2:-$here/target/debug/examples/kubelet_call}
if [ ! -x "$gp" ] || [ ! -x "$kc" ]; then
  cargo build --features dra,testkit --bin gpupass --example kubelet_call >&2
fi
command -v strace > /dev/null || { echo "scancount: strace is needed (apt-get install strace)" >&2; exit 1; }
out=$here/target/scancount
rm -rf "$out"
mkdir -p "$out"
VGA=0000:00:05.0
DEV=pci-0000-00-05-0

# fresh NAME: a new copy of the fixture host with a boot id, a hostname and a recorded CDI spec.
fresh() {
  host=$out/$1/host
  mkdir -p "$out/$1"
  cp -a tests/fixtures/hosts/qemu-lab "$host"
  mkdir -p "$host/proc/sys/kernel/random"
  echo 5ca1ab1e-0000-4000-8000-000000000001 > "$host/proc/sys/kernel/random/boot_id"
  echo node-a > "$host/proc/sys/kernel/hostname"
  # Another group on vfio-pci already (the edu device, 00:06.0, group 5), so `cdi generate
  # --write` has something to describe: the spec every change then refreshes.
  GPUPASS_FAKE_KERNEL=1 "$gp" --root "$host" bind 0000:00:06.0 > /dev/null
  GPUPASS_FAKE_KERNEL=1 "$gp" --root "$host" cdi generate --write > /dev/null
  [ -f "$host/var/run/cdi/gpupass.json" ] || { echo "scancount: no CDI spec recorded in $host" >&2; exit 1; }
}

# count TRACE [FROM TO]: the figures of one request from strace -f -ttt -y output (the lines
# whose time is in [FROM, TO] when given).
count() {
  awk -v from="${2:-0}" -v to="${3:-1e12}" '
    { t = $2 + 0 }
    t < from || t > to { next }
    /getdents64\(/ && /\/sys\/bus\/pci\/devices>/ && / = 0$/ { full++ }
    /getdents64\(/ && /\/sys\/kernel\/iommu_groups\/4\/devices>/ && / = 0$/ { listing++ }
    /openat\([0-9]+<[^>]*\/0000:00:05\.0>, "modalias"/ { reads++ }
    END { printf "full %d, reads %d, groups %d, listing %d\n", full, reads, reads - full, listing }
  ' "$1"
}

trace() { strace -f -ttt -y -qq -e trace=openat,getdents64 -o "$@"; }

# The commands: each a process of its own.
fresh cli
host=$out/cli/host
trace "$out/cli/bind.trace" env GPUPASS_FAKE_KERNEL=1 "$gp" --root "$host" bind "$VGA" > "$out/cli/bind.out" 2>&1
grep -q "vfio-pci" "$out/cli/bind.out" || { cat "$out/cli/bind.out" >&2; exit 1; }
echo "bind:      $(count "$out/cli/bind.trace")"
trace "$out/cli/unbind.trace" env GPUPASS_FAKE_KERNEL=1 "$gp" --root "$host" unbind "$VGA" > "$out/cli/unbind.out" 2>&1
echo "unbind:    $(count "$out/cli/unbind.trace")"

# The DRA plugin: one Prepare and one Unprepare on its socket.
fresh dra
host=$out/dra/host
claims=$out/dra/claims
mkdir -p "$claims/default"
cat > "$claims/default/gpu.json" << EOF
{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
 "metadata": {"name": "gpu", "namespace": "default", "uid": "u1"},
 "status": {"allocation": {
   "devices": {"results": [{"request": "vfio", "driver": "vfio.gpupass.dev", "pool": "node-a", "device": "$DEV"}]},
   "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}}}
EOF
sock=$out/dra/plugin/dra.sock
trace "$out/dra/plugin.trace" env GPUPASS_FAKE_KERNEL=1 "$gp" --root "$host" dra-plugin -v --node node-a \
  --claims-dir "$claims" --poll-ms 10000 --binding-conditions off \
  --registry-dir "$out/dra/registry" --plugin-dir "$out/dra/plugin" > "$out/dra/plugin.log" 2>&1 &
pid=$!
trap 'kill $pid 2> /dev/null || true' EXIT
for _ in $(seq 200); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { cat "$out/dra/plugin.log" >&2; exit 1; }
sleep 1.5 # the worker's first refresh
now() { date +%s.%N; }
t0=$(now)
"$kc" "$sock" prepare default gpu u1 > "$out/dra/prepare.out"
sleep 1.5
t1=$(now)
"$kc" "$sock" unprepare default gpu u1 > "$out/dra/unprepare.out"
sleep 1.5
t2=$(now)
kill -TERM $pid
wait $pid || true
trap - EXIT
grep -q "prepared default/gpu" "$out/dra/prepare.out" || { cat "$out/dra/prepare.out" "$out/dra/plugin.log" >&2; exit 1; }
echo "prepare:   $(count "$out/dra/plugin.trace" "$t0" "$t1")"
echo "unprepare: $(count "$out/dra/plugin.trace" "$t1" "$t2")"
echo "(load $(cut -d' ' -f1-3 /proc/loadavg); $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo '+changes'))"
