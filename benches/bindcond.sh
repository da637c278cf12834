#!/usr/bin/env bash
# Binding conditions (docs/dra.md, "Binding conditions") against the real kube-apiserver,
# kube-scheduler and kube-controller-manager 1.37.2 of the cluster build, on this host's
# loopback (lab/cluster/host.sh), without a guest: `gpupass dra-plugin` (built with
# `--features dra,testkit`) serves a copy of the lab guest's device tree
# (tests/fixtures/hosts/qemu-lab) through the test kit's fake kernel (GPUPASS_FAKE_KERNEL=1),
# for a Node object `lab` that has no kubelet (Pods tolerate its taints; nothing runs them, so
# this times scheduling up to the bind, not Running: lab/scenarios/clusterbind.sh does that).
#
# What it does and prints (one line each):
#   1. the slices carry gpupass.dev/GroupBound and GroupBindFailed on pci-0000-00-05-0;
#   2. a Pod with a lab-vga claim: samples of the claim's conditions and the Pod's node, the
#      condition True before the node is set; the group on vfio-pci; the Pod deleted before any
#      kubelet prepared it: the plugin gives the group back;
#   3. /dev/dri/card9 of 00:05.0 "open" by pid 4321 (Xorg) in the fake /proc: FailedScheduling
#      with reason=InUse naming the pid, the Pod never bound, the group untouched; the holder
#      gone: the Pod is bound;
#   4. N Pods each way (with; then the plugin restarted with --binding-conditions off):
#      seconds from `kubectl create` to the Pod's nodeName, median and mean.
#
# Usage: benches/bindcond.sh [N]   (N: Pods timed each way, default 5). Needs the cluster build
# (lab/cluster/build.sh) and target/debug/gpupass built with --features dra,testkit.
# Exit status: 0 every check held, 1 one did not (named), 2 setup.
set -uo pipefail
N=${1:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=$("$here/lab/cluster/build.sh" --print-dir)/bin
gp=${GPUPASS_BIN:-$here/target/debug/gpupass}
[ -x "$bin/kube-apiserver" ] || { echo "no cluster build (lab/cluster/build.sh)" >&2; exit 2; }
[ -x "$gp" ] || { echo "no $gp (cargo build --features dra,testkit)" >&2; exit 2; }
w=$(mktemp -d /tmp/bindcond.XXXXXX)
st=$w/st host=$w/host
KC() { "$bin/kubectl" --kubeconfig "$st/admin.kubeconfig" --request-timeout=30s "$@"; }
fail() { echo "FAIL: $*"; bad=1; }
wait_for() { # SECONDS CMD...
  local end=$((SECONDS + $1)); shift
  until "$@"; do [ $SECONDS -lt $end ] || return 1; sleep 0.2; done
}
bad=0
sleep 7200 & runner=$!
plugin=
cleanup() {
  [ -n "$plugin" ] && kill "$plugin" 2> /dev/null || true
  "$here/lab/cluster/host.sh" down "$st" > /dev/null 2>&1 || true
  kill "$runner" 2> /dev/null || true
  rm -rf "$w"
}
trap cleanup EXIT

setup() { "$@" || { echo "setup failed: $*" >&2; exit 2; }; }
setup "$here/lab/cluster/host.sh" ports "$st"
api=$(awk '$1 == "api" { print $2 }' "$st/ports")
CL_SERVER=https://127.0.0.1:$api setup "$here/lab/cluster/prep.sh" "$bin" "$w/cl" > "$w/prep.log" 2>&1
setup "$here/lab/cluster/host.sh" up "$bin" "$w/cl" "$st" "$runner"
setup "$here/lab/cluster/host.sh" wait "$st" 180 > /dev/null

# The lab guest's devices, with a DRM node for 00:05.0 (bochs-drm) and the files the plugin reads.
cp -a "$here/tests/fixtures/hosts/qemu-lab" "$host"
d=$host/sys/devices/pci0000:00/0000:00:05.0
mkdir -p "$d/drm/card9" "$host/sys/class/drm" "$host/proc/sys/kernel/random"
echo 226:9 > "$d/drm/card9/dev"
ln -s ../../../0000:00:05.0 "$d/drm/card9/device"
ln -s ../../devices/pci0000:00/0000:00:05.0/drm/card9 "$host/sys/class/drm/card9"
touch "$host/dev/dri/card9"
cat /proc/sys/kernel/random/uuid > "$host/proc/sys/kernel/random/boot_id"
echo lab > "$host/proc/sys/kernel/hostname"
drv() { basename "$(readlink "$host/sys/bus/pci/devices/$1/driver")"; }

now=$(date -u +%FT%TZ)
KC apply -f - > /dev/null << EOF
apiVersion: v1
kind: Node
metadata: {name: lab, labels: {kubernetes.io/hostname: lab}}
EOF
KC patch node lab --subresource=status --type=merge -p "{\"status\":{\"capacity\":{\"cpu\":\"4\",\"memory\":\"8Gi\",\"pods\":\"110\"},\"allocatable\":{\"cpu\":\"4\",\"memory\":\"8Gi\",\"pods\":\"110\"},\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"NoKubelet\",\"message\":\"benches/bindcond.sh\",\"lastHeartbeatTime\":\"$now\",\"lastTransitionTime\":\"$now\"}]}}" > /dev/null
has_sa() { KC get serviceaccount default > /dev/null 2>&1; }
wait_for 120 has_sa || { echo "setup failed: no default service account" >&2; exit 2; }
KC apply -f "$here/contrib/dra/deviceclass.yaml" -f "$here/contrib/dra/claim-examples.yaml" > /dev/null

start_plugin() { # LOG ARGS...
  local log=$1; shift
  GPUPASS_FAKE_KERNEL=1 "$gp" --root "$host" dra-plugin -v --node lab --kubeconfig "$st/admin.kubeconfig" "$@" > "$w/$log" 2>&1 &
  plugin=$!
}
stop_plugin() { kill "$plugin"; wait "$plugin" 2> /dev/null || true; plugin=; }
pod() { # NAME
  KC create -f - > /dev/null << EOF
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  tolerations: [{operator: Exists}]
  resourceClaims: [{name: vfio, resourceClaimTemplateName: lab-vga}]
  containers: [{name: c, image: busybox, resources: {claims: [{name: vfio}]}}]
EOF
}
node_of() { KC get pod "$1" -o jsonpath='{.spec.nodeName}' 2> /dev/null; }
conds_of() {
  local c
  c=$(KC get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}' 2> /dev/null)
  KC get resourceclaim "${c:-none}" -o jsonpath='{range .status.devices[*].conditions[*]}{.type}={.status}/{.reason},{end}' 2> /dev/null
}
slices_have() { KC get resourceslices -o json | grep GroupBound > /dev/null; }
on_vfio() { [ "$(drv 0000:00:05.0) $(drv 0000:00:05.1)" = "vfio-pci vfio-pci" ]; }
on_host() { [ "$(drv 0000:00:05.0) $(drv 0000:00:05.1)" = "bochs-drm snd_hda_intel" ]; }
bound() { [ -n "$(node_of "$1")" ]; }
gone_and_given_back() { ! KC get pod "$1" > /dev/null 2>&1 && on_host; }

# 1.
start_plugin plugin.log
wait_for 120 slices_have || fail "no GroupBound in the slices: $(tail -3 "$w/plugin.log")"
echo "1. $(grep -o 'binding conditions: .*' "$w/plugin.log" | head -1); pci-0000-00-05-0 published with GroupBound/GroupBindFailed"

# 2.
pod b1
seen_window=0 seen_bad=0
for _ in $(seq 1 300); do
  c=$(conds_of b1); n=$(node_of b1)
  case $c in *GroupBound=True*) [ -z "$n" ] && seen_window=$((seen_window + 1)) ;; *) [ -n "$n" ] && seen_bad=1 ;; esac
  [ -n "$n" ] && break
  sleep 0.2
done
[ -n "$(node_of b1)" ] || fail "b1 never bound: $(KC get events --field-selector involvedObject.name=b1 -o jsonpath='{range .items[*]}{.reason}: {.message};{end}')"
[ $seen_bad = 0 ] || fail "b1 was on the node before its claim's GroupBound was True"
on_vfio || fail "b1 bound, the group on $(drv 0000:00:05.0) $(drv 0000:00:05.1)"
ev=$(KC get events --field-selector involvedObject.name=b1 -o jsonpath='{range .items[*]}{.reason},{end}')
case $ev in *BindingConditionsPending*) ;; *) fail "no BindingConditionsPending event: $ev" ;; esac
echo "2. b1 bound after GroupBound=True ($seen_window samples with the condition True and no node yet; events $ev); group on vfio-pci"
KC delete pod b1 --grace-period=0 --force > /dev/null 2>&1
wait_for 60 gone_and_given_back b1 || fail "b1 deleted before any Prepare: the group stayed on $(drv 0000:00:05.0)"
echo "   b1 deleted before any Prepare: $(grep -o 'was bound before binding and is no longer allocated here: .*' "$w/plugin.log" | tail -1); group $(drv 0000:00:05.0) $(drv 0000:00:05.1)"

# 3.
mkdir -p "$host/proc/4321/fd"
echo Xorg > "$host/proc/4321/comm"
ln -s /dev/dri/card9 "$host/proc/4321/fd/7"
pod h1
failed() { KC get events --field-selector involvedObject.name=h1 -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' | grep 'reason=InUse.*pid 4321' > /dev/null; }
wait_for 120 failed || fail "no FailedScheduling with reason=InUse and pid 4321"
sleep 10
bound h1 && fail "h1 bound to $(node_of h1) while the DRM node was held"
on_host || fail "held: the group moved to $(drv 0000:00:05.0)"
echo "3. held: $(KC get events --field-selector involvedObject.name=h1 -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' | grep -c 'reason=InUse') FailedScheduling events with reason=InUse, e.g. $(KC get events --field-selector involvedObject.name=h1 -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' | grep -m1 -o 'reason=InUse.*pid 4321 (Xorg)'); Pod $(KC get pod h1 -o jsonpath='{.status.phase}'), no node; group $(drv 0000:00:05.0) $(drv 0000:00:05.1)"
rm -rf "$host/proc/4321"
t0=$SECONDS
wait_for 120 bound h1 || fail "h1 not bound after the holder went"
echo "   holder gone: h1 bound to $(node_of h1) within $((SECONDS - t0)) s; group $(drv 0000:00:05.0) $(drv 0000:00:05.1)"
KC delete pod h1 --grace-period=0 --force > /dev/null 2>&1
wait_for 60 gone_and_given_back h1 || fail "h1 deleted: group stayed on $(drv 0000:00:05.0)"

# 4.
timed() { # MODE I
  local p=t-$1-$2 t0 t1
  t0=$(date +%s.%N)
  pod "$p"
  wait_for 300 bound "$p" || fail "$p never bound"
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f\n", b - a }' >> "$w/$1.txt"
  KC delete pod "$p" --grace-period=0 --force > /dev/null 2>&1
  wait_for 60 gone_and_given_back "$p" || fail "$p: group not given back"
}
summary() {
  sort -n "$w/$1.txt" | awk -v m="$1" '{ v[NR] = $1; s += $1 } END { printf "%s binding conditions: %d Pods, creation to bound: median %.2f s, mean %.2f s (", m, NR, v[int((NR + 1) / 2)], s / NR }'
  tr '\n' ' ' < "$w/$1.txt" | sed 's/ $//'; echo ")"
}
for i in $(seq 1 "$N"); do timed with "$i"; done
stop_plugin
start_plugin plugin-off.log --binding-conditions off
wait_for 120 sh -c "! '$bin/kubectl' --kubeconfig '$st/admin.kubeconfig' get resourceslices -o json | grep GroupBound > /dev/null" || fail "slices kept GroupBound with --binding-conditions off"
for i in $(seq 1 "$N"); do timed without "$i"; done
echo "4. $(summary with)"
echo "   $(summary without)"
echo "   load average $(cat /proc/loadavg)"
[ $bad = 0 ] && echo "bindcond: PASS" || { echo "bindcond: FAILED"; exit 1; }
