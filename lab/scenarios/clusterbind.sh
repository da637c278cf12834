# lab-about: binding conditions (KEP-5007) on the real scheduler, kubelet and API server of the cluster lab (docs/dra.md, "Binding conditions"): `gpupass dra-plugin` publishes the VGA+audio group 00:05.0+00:05.1 (on its host drivers) with gpupass.dev/GroupBound and GroupBindFailed, binds it to vfio-pci from its claim watcher after the scheduler allocated it and before the Pod is bound, and sets the condition on the claim's device status; with the VGA's DRM node held open by a host process the bind fails as InUse, the Pod goes back to the scheduler (Pending, the reason in its events) and runs once the holder is gone; Pod creation to Running timed with and without binding conditions
# lab-judge: rust
# lab-needs: gpupass
# lab-carry: cluster
# lab-mem: 2048
# lab-smp: 2
# lab-cgroup: v2
# lab-modules: 9pnet_virtio
# lab-modules: 9p
# lab-modules: overlay
# lab-modules: virtio_net
# lab-timeout: 1500
#
# Judged in Rust (tests/it/labjudge/clusterbind.rs): this script decides nothing. It runs the
# commands and ships what the API server, the plugin and sysfs said (lab_cmd, lab_facts); the
# judge decides every step. Run alone (lab/lab.sh --kernel 6.12 run clusterbind) or after other
# cluster scenarios in the same boot. BIND_N (default 3) Pods are timed each way.
# shellcheck source=../cluster/guest.sh
. /lab/cluster/lib.sh
cluster_begin

VGA=0000:00:05.0
AUD=0000:00:05.1
DRIVER=vfio.gpupass.dev
PDIR=/var/lib/kubelet/plugins/$DRIVER
N=${BIND_N:-3}
g=$(lab_group $VGA)
card=$(ls /sys/bus/pci/devices/$VGA/drm 2> /dev/null | grep '^card' | head -1)
# drivers NAME [KEY=VALUE...]: the group's drivers (and more facts) as NAME.facts.
drivers() {
  _dn=$1; shift
  lab_facts "$_dn" "vga.driver=$(lab_driver $VGA)" "aud.driver=$(lab_driver $AUD)" "group=$g" "card=$card" "t=$(cl_t)" "$@"
}
claim_of() { kc get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}' 2> /dev/null; }
# ship NAME POD: the Pod, its claim and its events as JSON (NAME-pod, NAME-claim, NAME-events).
ship() {
  lab_cmd "$1-pod" kc get pod "$2" -o json
  _c=$(claim_of "$2")
  lab_cmd "$1-claim" kc get resourceclaim "${_c:-none}" -o json --show-managed-fields
  lab_cmd "$1-events" kc get events --field-selector "involvedObject.name=$2" -o json
}
# sample NAME POD SECONDS UNTIL: every ~0.5 s until UNTIL (a shell test) holds or SECONDS
# pass, one line "T NODE CONDITIONS PHASE" (T seconds since the Pod's creation; the claim read
# before the Pod, so a condition seen with no node was set before the Pod was bound); shipped
# as NAME.samples.
sample() {
  _sn=$1 _sp=$2 _ss=$3 _su=$4
  _st0=$(cl_t)
  : > "$_sn.samples"
  while :; do
    _sc=$(claim_of "$_sp")
    _cond=$(kc get resourceclaim "${_sc:-none}" -o jsonpath='{range .status.devices[*].conditions[*]}{.type}={.status}/{.reason},{end}' 2> /dev/null)
    _pl=$(kc get pod "$_sp" -o jsonpath='{.spec.nodeName} {.status.phase}' 2> /dev/null)
    _node=${_pl% *} _phase=${_pl##* }
    echo "$(cl_since "$_st0") node=${_node:--} cond=${_cond:--} phase=${_phase:--}" >> "$_sn.samples"
    eval "$_su" && break
    [ "$(awk -v a="$_st0" -v b="$(cl_t)" -v s="$_ss" 'BEGIN { print (b - a > s) }')" = 1 ] && break
    sleep 0.5
  done
  lab_file "$_sn.samples" "$_sn.samples"
}
running() { [ "$(kc get pod "$1" -o jsonpath='{.status.phase}' 2> /dev/null)" = Running ]; }
# timed NAME POD TEMPLATE: a Pod created, seconds from its creation to Running (guest clock),
# deleted again and its group given back; NAME.facts has secs= and the drivers while it ran.
timed() {
  _t0=$(cl_t)
  cl_claim_pod "$2" "$3"
  until running "$2"; do
    [ "$(awk -v a="$_t0" -v b="$(cl_t)" 'BEGIN { print (b - a > 600) }')" = 1 ] && break
    sleep 0.3
  done
  _secs=$(cl_since "$_t0")
  drivers "$1" "secs=$_secs" "phase=$(kc get pod "$2" -o jsonpath='{.status.phase}' 2> /dev/null)"
  kc delete pod "$2" --wait=true --timeout=300s > /dev/null 2>&1
  cl_wait 300 sh -c "[ \"\$(basename \$(readlink /sys/bus/pci/devices/$VGA/driver))\" != vfio-pci ]"
}

drivers start
t=$(cl_t)
cl_start bc-plugin gpupass dra-plugin -v --node "$CL_NODE" --kubeconfig "$CL/admin.kubeconfig"
cl_wait 180 grep -q "the kubelet registered $DRIVER" "$CL_LOG/bc-plugin.log"
cl_wait 120 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get resourceslices --field-selector spec.nodeName=$CL_NODE,spec.driver=$DRIVER -o json | grep -q GroupBound"
lab_facts registered "registered=$(grep -c "the kubelet registered $DRIVER" "$CL_LOG/bc-plugin.log")" "after=$(cl_since "$t")"
lab_cmd slices kc get resourceslices --field-selector "spec.nodeName=$CL_NODE,spec.driver=$DRIVER" -o json
kc apply -f "$CL/dra/deviceclass.yaml" > /dev/null 2>&1
kc apply -f "$CL/dra/claim-examples.yaml" > /dev/null 2>&1

# 1. Bound before binding: the claim's condition first, then the Pod's node, then Running.
cl_claim_pod bc-run lab-vga
sample bc-run bc-run 600 "running bc-run"
drivers bound
ship bound bc-run
cl_logs bc-run > bc-run.txt
lab_file bc-run.txt bc-run.txt
kc delete pod bc-run --wait=true --timeout=300s > /dev/null 2>&1
cl_wait 300 sh -c "[ \"\$(basename \$(readlink /sys/bus/pci/devices/$VGA/driver))\" = \"$(sed -n 's/^vga.driver=//p' start.facts)\" ]"
drivers released

# 2. Held by a host process: the VGA's DRM node open (gpupass's in-use refusal), the bind
# before binding fails, the Pod is not bound; the holder goes and the Pod runs.
sh -c "exec 7< /dev/dri/$card; exec sleep 900" &
hpid=$!
sleep 0.5
cl_claim_pod bc-held lab-vga
cl_wait 300 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get events --field-selector involvedObject.name=bc-held -o json | grep -q InUse"
# Once more after the first failure: the scheduler retries and fails again while held.
sample bc-held bc-held 25 false
drivers held "holder.pid=$hpid" "holder.node=/dev/dri/$card" "holder.alive=$(kill -0 $hpid 2> /dev/null && echo yes || echo no)"
# The device's busy taint while held (gpupass.dev/busy: the scheduler does not choose it again).
lab_cmd held-slices kc get resourceslices --field-selector "spec.nodeName=$CL_NODE,spec.driver=$DRIVER" -o json
ship held bc-held
kill $hpid
wait $hpid 2> /dev/null
sample bc-freed bc-held 600 "running bc-held"
drivers freed "holder.alive=$(kill -0 $hpid 2> /dev/null && echo yes || echo no)"
lab_cmd freed-slices kc get resourceslices --field-selector "spec.nodeName=$CL_NODE,spec.driver=$DRIVER" -o json
ship freed bc-held
kc delete pod bc-held --wait=true --timeout=300s > /dev/null 2>&1
cl_wait 300 sh -c "[ \"\$(basename \$(readlink /sys/bus/pci/devices/$VGA/driver))\" != vfio-pci ]"

# 3. Creation to Running, with binding conditions and without (the plugin restarted with
# --binding-conditions off republishes the group without them).
i=1
while [ $i -le "$N" ]; do timed "with-$i" "bc-with-$i" lab-vga; i=$((i + 1)); done
kill "$(cat "$CL_RUN/bc-plugin.pid")"
cl_wait 30 sh -c "! kill -0 $(cat "$CL_RUN/bc-plugin.pid")"
cl_start bc-plugin-off gpupass dra-plugin -v --node "$CL_NODE" --kubeconfig "$CL/admin.kubeconfig" --binding-conditions off
cl_wait 180 grep -q "the kubelet registered $DRIVER" "$CL_LOG/bc-plugin-off.log"
cl_wait 120 sh -c "! kubectl --kubeconfig $CL/admin.kubeconfig get resourceslices --field-selector spec.nodeName=$CL_NODE,spec.driver=$DRIVER -o json | grep -q GroupBound"
lab_cmd slices-off kc get resourceslices --field-selector "spec.nodeName=$CL_NODE,spec.driver=$DRIVER" -o json
i=1
while [ $i -le "$N" ]; do timed "without-$i" "bc-without-$i" lab-vga; i=$((i + 1)); done
lab_facts bench "n=$N" "loadavg=$(cat /proc/loadavg)"

lab_cmd checkpoint cat "$PDIR/checkpoint.json"
lab_cmd recover gpupass recover --dry-run
drivers end
kill "$(cat "$CL_RUN/bc-plugin-off.pid")"
cl_wait 30 sh -c "! kill -0 $(cat "$CL_RUN/bc-plugin-off.pid")"
lab_file bc-plugin.log "$CL_LOG/bc-plugin.log"
lab_file bc-plugin-off.log "$CL_LOG/bc-plugin-off.log"
cluster_end
