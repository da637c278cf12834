#!/usr/bin/env bash
# ResourceSlice publication for the 4096-function host against a real API server
# (docs/performance.md, "DRA"): etcd and kube-apiserver from the cluster build
# (lab/cluster/build.sh, cached) started on loopback by lab/cluster/host.sh with certificates of
# their own (lab/cluster/prep.sh), then `cargo bench --features dra --bench dra` with their
# admin kubeconfig: gpupass's publisher beside kubectl, interleaved (benches/dra.rs).
#
#   benches/drapublish.sh [ROUNDS]      # ROUNDS per contender, 10 by default
#
# Output also in target/drapublish/bench.txt, with the load average before and after.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
out=$PWD/target/drapublish
rm -rf "$out"
mkdir -p "$out/state"
lab/cluster/build.sh >&2
bin=$(lab/cluster/build.sh --print-dir)/bin
st=$out/state
lab/cluster/host.sh ports "$st"
api=$(awk '$1 == "api" { print $2 }' "$st/ports")
CL_SERVER=https://127.0.0.1:$api lab/cluster/prep.sh "$bin" "$out/cl" > "$out/prep.log"
# The runner the control plane's watchdog follows: this script.
lab/cluster/host.sh up "$bin" "$out/cl" "$st" $$
trap 'lab/cluster/host.sh down "$st" > /dev/null 2>&1 || true' EXIT
lab/cluster/host.sh wait "$st" 300
# Build first, so that the load figure below is the bench's, not the compiler's.
cargo bench --features dra --bench dra --no-run
{
  echo "load before: $(cat /proc/loadavg); $(nproc) CPUs; $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')"
  echo "kube-apiserver: $("$bin/kube-apiserver" --version)"
  BENCH_ROUNDS=$rounds GPUPASS_BENCH_KUBECONFIG=$st/admin.kubeconfig GPUPASS_BENCH_KUBECTL=$bin/kubectl \
    cargo bench --features dra --bench dra
  echo "load after: $(cat /proc/loadavg)"
} 2>&1 | tee "$out/bench.txt"
