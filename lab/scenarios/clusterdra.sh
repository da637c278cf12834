# lab-about: `gpupass dra-plugin` against the real kubelet, scheduler, controller manager and API server of the cluster lab (docs/dra.md): the plugin publishes this node's ResourceSlices through kube-rs, the kubelet registers it, contrib/dra's DeviceClass and claim templates apply unchanged, the scheduler allocates the VGA+audio group 00:05.0+00:05.1 by a CEL selector on gpupass's attributes, the kubelet prepares it (both functions on vfio-pci while the Pod runs; its container opens the group's nodes, legacy and iommufd) and unprepares it (both back on their drivers); an mtty-2 mdev slot (KEP-4815 counters) is allocated, its instance created for the Pod (nodes opened, mdevUUID in the metadata) and removed after; a claim with a bad opaque config fails its Prepare with gpupass's reason in the Pod's events and touches nothing; on 6.1 (no iommufd) a claim with no config gets the legacy container and one that requires iommufd is refused before anything is written; the API server unreachable, and the plugin killed inside a Prepare. The guest runs the commands and ships their output; tests/it/labjudge/clusterdra.rs judges every step
# lab-needs: gpupass
# lab-carry: cluster
# lab-mem: 2048
# lab-smp: 2
# lab-cgroup: v2
# lab-modules: 9pnet_virtio
# lab-modules: 9p
# lab-modules: overlay
# lab-modules: virtio_net
# lab-timeout: 900
# lab-judge: rust
#
# Judged in Rust (docs/lab.md, "Judged scenarios"): after the cluster's bring-up (the shared
# lab/cluster/guest.sh, whose stages report their own results as in every cluster scenario),
# this script decides nothing. Each command runs under `lab_cmd NAME` (kubectl with -o json,
# gpupass as users run it, the Pods' logs), and what the guest read itself (the group's drivers,
# the mdev instance, how long a wait took) is shipped with `lab_facts NAME`; the judge,
# tests/it/labjudge/clusterdra.rs, decides every step. Each kernel leg has steps of its own
# (`iommufd-*` on 6.12; `auto-*` and `require-iommufd-*` on 6.1): the judge reads the leg from
# leg.facts. The waits below only bound how long the guest looks; each records what it saw.
#
# Run alone (lab/lab.sh --kernel 6.12 run clusterdra) or after other cluster scenarios in the
# same boot. On the 6.1 leg (lab/lab.sh --kernel 6.1 run clusterdra: the unified cgroup
# hierarchy, as Debian 12 boots it) the kernel has no iommufd: the plugin's default gives
# legacy claims, and a claim that requires iommufd is refused before anything is written. The
# group is the lab's 00:05.0 (bochs-drm) + 00:05.1 (snd_hda_intel): what a GPU with its HDMI
# audio function is, and what the NVIDIA driver's PassthroughSupport rebinds one function of.
# shellcheck source=../cluster/guest.sh
. /lab/cluster/lib.sh
cluster_begin

VGA=0000:00:05.0
AUD=0000:00:05.1
DEV=pci-0000-00-05-0
DRIVER=vfio.gpupass.dev
PDIR=/var/lib/kubelet/plugins/$DRIVER
SEL="spec.nodeName=$CL_NODE,spec.driver=$DRIVER"
K="kubectl --kubeconfig $CL/admin.kubeconfig"
MTYPE=/sys/class/mdev_bus/mtty/mdev_supported_types/mtty-2

# drivers: "VGA-driver AUD-driver" (none when unbound).
drivers() { echo "$(lab_driver $VGA || echo none) $(lab_driver $AUD || echo none)"; }
# state NAME [KEY=VALUE...]: the group's drivers (and more) as NAME.facts.
state() {
  _sn=$1
  shift
  lab_facts "$_sn" "vga.driver=$(lab_driver $VGA || echo none)" "aud.driver=$(lab_driver $AUD || echo none)" "$@"
}
# waited NAME T0 SECONDS CMD...: CMD until it succeeds (every second), at most SECONDS; ships
# NAME.facts with ok=1|0, the seconds since T0 and the group's drivers then.
waited() {
  _wn=$1 _wt=$2 _end=$(($(cut -d. -f1 /proc/uptime) + $3))
  shift 3
  _ok=0
  while [ "$(cut -d. -f1 /proc/uptime)" -le "$_end" ]; do
    if "$@" > /dev/null 2>&1; then
      _ok=1
      break
    fi
    sleep 1
  done
  state "$_wn" "ok=$_ok" "seconds=$(cl_since "$_wt")"
}
# slices NAME: this node's slices of the driver as JSON (NAME.out).
slices() { lab_cmd "$1" kc get resourceslices --field-selector "$SEL" -o json; }
offers() { kc get resourceslices --field-selector "$SEL" -o jsonpath='{.items[*].spec.devices[*].name}' | tr ' ' '\n' | grep -qx "$1"; }
claim_of() { kc get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}' 2> /dev/null; }
# allocated POD PATTERN: the POD's claim is allocated a device whose name matches ^PATTERN.
allocated() { kc get resourceclaim "$(claim_of "$1")" -o jsonpath='{.status.allocation.devices.results[*].device}' | grep -q "^$2"; }
# pod_ready POD: the Pod's container printed READY (cl_claim_pod's probe).
pod_ready() {
  _c=$(crictl ps -a --label "io.kubernetes.pod.name=$1" -q | head -1)
  [ -n "$_c" ] && crictl logs "$_c" 2>&1 | grep -qx READY
}
# ship PREFIX POD: the Pod, its claim and its events as JSON, and what its container printed.
ship() {
  lab_cmd "$1-pod" kc get pod "$2" -o json
  _c=$(claim_of "$2")
  lab_cmd "$1-claim" kc get resourceclaim "${_c:-none}" -o json
  lab_cmd "$1-events" kc get events --field-selector "involvedObject.name=$2" -o json
  lab_cmd "$1-log" cl_logs "$2"
}

lab_facts leg "leg=$LAB_KERNEL" "kernel=$(uname -r)"
state start "group=$(lab_group $VGA)"
start_drivers=$(drivers)
same_drivers() { [ "$(drivers)" = "$start_drivers" ]; }

# 1. The plugin serves; the kubelet's plugin watcher finds its registration socket and calls back.
t=$(cl_t)
cl_start dra-plugin gpupass dra-plugin -v --node "$CL_NODE" --kubeconfig "$CL/admin.kubeconfig"
waited plugin-start "$t" 120 test -S "$PDIR/dra.sock"
waited registered "$t" 180 grep -q "the kubelet registered $DRIVER" "$CL_LOG/dra-plugin.log"
if ! grep -q "the kubelet registered $DRIVER" "$CL_LOG/dra-plugin.log"; then
  # Nothing after this can work: ship the sockets and the logs and end.
  lab_cmd sockets ls -la /var/lib/kubelet/plugins_registry "$PDIR"
  cluster_end
  exit 1
fi

# 2. The plugin's own slices, on the API server (not `dra slices | kubectl apply`); what
# gpupass does not offer is absent from them, and `dra slices --explain` says why.
waited published "$t" 180 offers "$DEV"
slices slices
lab_cmd explain gpupass dra slices --explain --json
lab_cmd explain-table gpupass dra slices --explain

# 3. contrib/dra as shipped: the API server's own validation (CEL compiled, names, configs).
lab_cmd classes kc apply -f "$CL/dra/deviceclass.yaml"
lab_cmd templates kc apply -f "$CL/dra/claim-examples.yaml"

# run_claim PREFIX POD TEMPLATE: the Pod created (cl_claim_pod, lab/cluster/guest.sh), its
# claim allocated $DEV, the Pod running; PREFIX-held.facts: the group's drivers and the VGA
# function's VFIO cdev while it runs.
run_claim() {
  _t=$(cl_t)
  cl_claim_pod "$2" "$3"
  waited "$1-allocated" "$_t" 300 allocated "$2" "$DEV\$"
  waited "$1-running" "$_t" 600 pod_ready "$2"
  ship "$1" "$2"
  state "$1-held" "cdev=$(ls /sys/bus/pci/devices/$VGA/vfio-dev 2> /dev/null | tr '\n' ' ')"
}
# end_claim PREFIX POD: the Pod deleted; the kubelet's Unprepare puts the group back.
end_claim() {
  _t=$(cl_t)
  _c=$(claim_of "$2")
  lab_cmd "$1-delete" kc delete pod "$2" --wait=true --timeout=300s
  lab_facts "$1-deleted" "seconds=$(cl_since "$_t")"
  waited "$1-restored" "$_t" 300 same_drivers
  cl_wait 120 sh -c "! $K get resourceclaim ${_c:-none}" || true
}

# 4. The shipped lab-vga template: the scheduler matches 1234:1111 with groupSize 2 (CEL),
# backendPolicy legacy from its opaque config.
run_claim legacy dra-legacy lab-vga
# Health that never goes stale (#45): the kubelet turns a device Unknown when the plugin's
# health stream says nothing of it within its health_check_timeout_seconds (30 s; the plugin
# sends the full list every 10 s). After 40 quiet seconds the Pod's allocatedResourcesStatus
# (ResourceHealthStatus, beta and on in 1.37) must still say Healthy for the claim's device.
t=$(cl_t)
sleep 40
lab_cmd health kc get pod dra-legacy -o json
lab_facts health "seconds=$(cl_since "$t")"
# One owner per group (#45): the journal records the claim as the group's holder, so the
# host's `gpupass unbind --all` refuses to take the group from under the running Pod, naming
# the claim, and changes nothing.
lab_cmd host-unbind gpupass unbind --all
state host-unbind
end_claim legacy dra-legacy

# 5. A mediated device (KEP-4815 counters): the mtty sample parent is a counter set on the API
# server with one counter per type (its available instances); the shipped lab-mtty template
# (class mdev.vfio.gpupass.dev, CEL on mdevType) is allocated one mtty-2 slot; Prepare creates
# the instance through the engine, the container opens its VFIO nodes and reads its mdevUUID
# (KubeVirt's key); Unprepare removes it and the type's count is back.
avail_before=$(cat $MTYPE/available_instances)
lab_facts mdev-before "available=$avail_before"
slices mdev-slices
t=$(cl_t)
cl_claim_pod dra-mdev lab-mtty
waited mdev-allocated "$t" 300 allocated dra-mdev mdev-mtty-mtty-2-
waited mdev-running "$t" 600 pod_ready dra-mdev
ship mdev dra-mdev
muuid=$(ls $MTYPE/devices 2> /dev/null | head -1)
lab_facts mdev-instance "uuid=$muuid" \
  "group=$(basename "$(readlink "/sys/bus/mdev/devices/${muuid:-none}/iommu_group" 2> /dev/null)" 2> /dev/null)" \
  "cdev=$(ls "/sys/bus/mdev/devices/${muuid:-none}/vfio-dev" 2> /dev/null | head -1)" \
  "available=$(cat $MTYPE/available_instances)"
lab_cmd mdev-checkpoint cat "$PDIR/checkpoint.json"
t=$(cl_t)
_c=$(claim_of dra-mdev)
lab_cmd mdev-delete kc delete pod dra-mdev --wait=true --timeout=300s
lab_facts mdev-deleted "seconds=$(cl_since "$t")"
waited mdev-removed "$t" 300 sh -c "[ ! -e /sys/bus/mdev/devices/${muuid:-none} ] && [ \$(cat $MTYPE/available_instances) = $avail_before ]"
lab_facts mdev-after "present=$([ -e "/sys/bus/mdev/devices/${muuid:-none}" ] && echo yes || echo no)" \
  "available=$(cat $MTYPE/available_instances)" "instances=$(ls /sys/bus/mdev/devices 2>&1 | tr '\n' ' ')"
cl_wait 120 sh -c "! $K get resourceclaim ${_c:-none}" || true

# policy_template NAME POLICY: a claim template for the VGA function whose opaque config sets
# backendPolicy POLICY (a value gpupass may not know), applied.
policy_template() {
  cl_template "$1" vfio.gpupass.dev "device.attributes[\"resource.kubernetes.io\"].pciBusID == \"$VGA\"" "$2"
  kc apply -f "$1.yaml" > /dev/null
}

# 6. A template of our own with no config: the plugin's --backend auto, iommufd on 6.12;
# legacy on 6.1, whose kernel has no iommufd (one backend for the node: no /dev/iommu, no cdev).
cl_template lab-vga-auto vfio.gpupass.dev "device.attributes[\"resource.kubernetes.io\"].pciBusID == \"$VGA\" && device.attributes[\"gpupass.dev\"].members == \"$VGA,$AUD\""
kc apply -f lab-vga-auto.yaml > /dev/null
if [ "$LAB_KERNEL" = 6.12 ]; then
  run_claim iommufd dra-iommufd lab-vga-auto
  end_claim iommufd dra-iommufd
else
  run_claim auto dra-auto lab-vga-auto
  slices auto-slices
  end_claim auto dra-auto
  # 6b. require-iommufd on this kernel: Prepare refuses before the first write, with the
  # kernel's reason in the Pod's events; the group never leaves its drivers (sampled every 2 s
  # while the kubelet retries, then 10 s more) and the journal holds nothing.
  policy_template lab-vga-iommufd require-iommufd
  t=$(cl_t)
  cl_claim_pod dra-require lab-vga-iommufd
  refused() { kc get events --field-selector involvedObject.name=dra-require -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' | grep -q 'require-iommufd'; }
  both() { drivers | tr ' ' '+'; }
  seen=$(cl_samples 150 refused both)
  lab_facts require-event "seconds=$(cl_since "$t")"
  seen="$seen $(cl_samples 5 false both)"
  lab_cmd require-events kc get events --field-selector involvedObject.name=dra-require -o json
  lab_cmd require-claim kc get resourceclaim "$(claim_of dra-require)" -o json
  lab_cmd require-checkpoint cat "$PDIR/checkpoint.json"
  lab_cmd require-recover gpupass recover --dry-run
  state require-untouched "samples=$seen"
  kc delete pod dra-require --wait=true --timeout=300s > /dev/null 2>&1
fi

# 7. A claim whose opaque config has a value gpupass does not know: Prepare refuses with the
# reason, the kubelet reports it in the Pod's events, the group is not touched.
policy_template lab-vga-bad fastest
t=$(cl_t)
cl_claim_pod dra-bad lab-vga-bad
waited bad-event "$t" 300 sh -c "$K get events --field-selector involvedObject.name=dra-bad -o jsonpath='{range .items[*]}{.message}{\"\\n\"}{end}' | grep -q fastest"
lab_cmd bad-events kc get events --field-selector involvedObject.name=dra-bad -o json
state bad-untouched
kc delete pod dra-bad --wait=true --timeout=300s > /dev/null 2>&1

# 8. The API server unreachable: the node's routes to the host removed for a while. A host
# change meanwhile (00:07.0 bound: a function on vfio-pci is offered) cannot be published; the
# plugin says so and retries; with the routes back the slices show the change, and the node
# is Ready again (nothing restarted).
TD=0000:00:07.0
TDEV=pci-0000-00-07-0
cannot() { grep -c 'cannot publish the ResourceSlices' "$CL_LOG/dra-plugin.log"; }
t=$(cl_t)
warns=$(cannot)
ip route del default 2> /dev/null
ip route del 10.0.2.0/24 dev "$CL_NODE_NIC" 2> /dev/null
lab_cmd td-bind gpupass bind "$TD"
waited api-down "$t" 90 sh -c "[ \$(grep -c 'cannot publish the ResourceSlices' $CL_LOG/dra-plugin.log) -gt $warns ]"
lab_facts api-down-log "before=$warns" "after=$(cannot)" \
  "last=$(grep 'cannot publish the ResourceSlices' "$CL_LOG/dra-plugin.log" | tail -1 | sed 's/.*cannot publish/cannot publish/' | cut -c1-300)"
sleep 5
ip route add 10.0.2.0/24 dev "$CL_NODE_NIC" src "$CL_NODE_IP" 2> /dev/null
ip route add default via "$CL_HOST_IP" dev "$CL_NODE_NIC" 2> /dev/null
t=$(cl_t)
waited api-back "$t" 180 offers "$TDEV"
slices api-back-slices
lab_facts api-back-log "last=$(grep 'published the ResourceSlices' "$CL_LOG/dra-plugin.log" | tail -1 | sed 's/.*published/published/' | cut -c1-300)"
waited api-back-ready "$t" 300 sh -c "$K get node $CL_NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
lab_cmd api-back-node kc get node "$CL_NODE" -o json
lab_cmd td-unbind gpupass unbind "$TD"

# 9. The plugin dies inside a Prepare (the test kit's GPUPASS_CRASH_AFTER_WRITE=3: abort()
# after the third sysfs write of the group's bind, as kill -9 or a power cut would): the
# journal holds the claim's unfinished plan. The plugin started again undoes it before it
# serves (the group as it was), the kubelet registers it again and retries the Prepare, which
# now succeeds (an unfinished plan on those functions would refuse it); the Pod runs and its
# deletion gives the group back.
plugin_args="dra-plugin -v --node $CL_NODE --kubeconfig $CL/admin.kubeconfig"
_p=$(cat "$CL_RUN/dra-plugin.pid")
kill "$_p"
cl_wait 30 sh -c "! kill -0 $_p" || true
# shellcheck disable=SC2086 # plugin_args is words
cl_start dra-plugin-crash env GPUPASS_CRASH_AFTER_WRITE=3 gpupass $plugin_args
cl_wait 180 grep -q "the kubelet registered $DRIVER" "$CL_LOG/dra-plugin-crash.log" || true
t=$(cl_t)
cl_claim_pod dra-crash lab-vga
waited crash-died "$t" 300 sh -c "grep -q 'GPUPASS_CRASH_AFTER_WRITE=3: aborting now' $CL_LOG/dra-plugin-crash.log && ! kill -0 $(cat "$CL_RUN/dra-plugin-crash.pid")"
lab_cmd crash-claim-then kc get resourceclaim "$(claim_of dra-crash)" -o json
lab_cmd crash-recover gpupass recover --dry-run
t=$(cl_t)
# shellcheck disable=SC2086
cl_start dra-plugin-restarted gpupass $plugin_args
waited crash-undone "$t" 120 grep -q "interrupted before this start was undone" "$CL_LOG/dra-plugin-restarted.log"
waited crash-running "$t" 600 pod_ready dra-crash
ship crash dra-crash
end_claim crash dra-crash

# 10. Nothing left: no claim in the checkpoint, no unfinished plan in the journal; the plugin
# stops on SIGTERM and removes its sockets.
cl_wait 60 sh -c "! grep -q '\"uid\"' $PDIR/checkpoint.json 2>/dev/null" || true
lab_cmd checkpoint cat "$PDIR/checkpoint.json"
lab_cmd recover gpupass recover --dry-run
t=$(cl_t)
_p=$(cat "$CL_RUN/dra-plugin-restarted.pid")
kill "$_p"
waited plugin-stop "$t" 30 sh -c "! kill -0 $_p"
lab_cmd plugin-files ls "$PDIR" /var/lib/kubelet/plugins_registry
cluster_end
