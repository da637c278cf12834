# lab-about: `gpupass dra-plugin` against the real kubelet, scheduler, controller manager and API server of the cluster lab (docs/dra.md): the plugin publishes this node's ResourceSlices through kube-rs, the kubelet registers it, contrib/dra's DeviceClass and claim templates apply unchanged, the scheduler allocates the VGA+audio group 00:05.0+00:05.1 by a CEL selector on gpupass's attributes, the kubelet prepares it (both functions on vfio-pci while the Pod runs; its container opens the group's nodes, legacy and iommufd) and unprepares it (both back on their drivers); an mtty-2 mdev slot (KEP-4815 counters) is allocated, its instance created for the Pod (nodes opened, mdevUUID in the metadata) and removed after; a claim with a bad opaque config fails its Prepare with gpupass's reason in the Pod's events and touches nothing
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
# lab-steps: leg drivers-before plugin-start plugin-registered slices-published refused-not-published
# lab-steps: manifests-applied legacy-claim-allocated legacy-pod-running legacy-group-on-vfio
# lab-steps: legacy-opens legacy-metadata legacy-health-stays legacy-host-unbind-refused
# lab-steps: legacy-pod-deleted legacy-group-restored
# lab-steps: mdev-counters-published mdev-claim-allocated mdev-pod-running mdev-instance-created
# lab-steps: mdev-opens mdev-metadata mdev-pod-deleted mdev-instance-removed
# lab-steps-6.12: iommufd-claim-allocated iommufd-pod-running iommufd-opens iommufd-pod-deleted
# lab-steps-6.12: iommufd-group-restored
# lab-steps-6.1: auto-claim-allocated auto-pod-running auto-opens auto-pod-deleted
# lab-steps-6.1: auto-group-restored require-iommufd-event require-iommufd-untouched
# lab-steps: bad-config-event bad-config-untouched
# lab-steps: api-down-said api-back-republished api-back-node-ready
# lab-steps: crash-plugin-died crash-left-open crash-undone crash-retry-running crash-pod-deleted
# lab-steps: crash-group-restored
# lab-steps: checkpoint-empty journal-empty plugin-stop teardown
#
# Run alone (lab/lab.sh --kernel 6.12 run clusterdra) or after other cluster scenarios in the
# same boot. On the 6.1 leg (lab/lab.sh --kernel 6.1 run clusterdra: the unified cgroup
# hierarchy, as Debian 12 boots it) the kernel has no iommufd: the plugin's default gives
# legacy claims, and a claim that requires iommufd is refused before anything is written. The group is the lab's 00:05.0 (bochs-drm) + 00:05.1 (snd_hda_intel): what a GPU
# with its HDMI audio function is, and what the NVIDIA driver's PassthroughSupport rebinds one
# function of.
# shellcheck source=../cluster/guest.sh
. /lab/cluster/lib.sh
cluster_begin

VGA=0000:00:05.0
AUD=0000:00:05.1
DEV=pci-0000-00-05-0
DRIVER=vfio.gpupass.dev
PDIR=/var/lib/kubelet/plugins/$DRIVER
drv() { basename "$(readlink "/sys/bus/pci/devices/$1/driver" 2> /dev/null)" 2> /dev/null || echo none; }
g=$(lab_group $VGA)
before_vga=$(drv $VGA) before_aud=$(drv $AUD)
if [ "$before_vga" != vfio-pci ] && [ "$before_aud" != vfio-pci ] && [ -n "$g" ]; then
  lab_pass drivers-before "$VGA $before_vga, $AUD $before_aud, group $g"
else
  lab_fail drivers-before "$VGA $before_vga, $AUD $before_aud, group '$g': the group must start on its own drivers"
fi
# group_drivers: "VGA-driver AUD-driver".
group_drivers() { echo "$(drv $VGA) $(drv $AUD)"; }

t=$(cl_t)
cl_start dra-plugin gpupass dra-plugin -v --node "$CL_NODE" --kubeconfig "$CL/admin.kubeconfig"
if cl_wait 120 test -S "$PDIR/dra.sock"; then
  lab_pass plugin-start "serving $PDIR/dra.sock after $(cl_since "$t") s"
else
  lab_fail plugin-start "no $PDIR/dra.sock: $(tail -2 "$CL_LOG/dra-plugin.log" | tr '\n' '|')"
fi
# The kubelet's plugin watcher finds the registration socket and calls back.
if cl_wait 180 grep -q "the kubelet registered $DRIVER" "$CL_LOG/dra-plugin.log"; then
  lab_pass plugin-registered "the kubelet registered $DRIVER after $(cl_since "$t") s"
else
  lab_fail plugin-registered "no registration: kubelet: $(grep -E "$DRIVER|plugin_watcher|pluginwatcher|reconciler" "$CL_LOG/kubelet.log" | tail -3 | tr '\n' '|' | cut -c1-600); plugin: $(tail -3 "$CL_LOG/dra-plugin.log" | tr '\n' '|' | cut -c1-400)"
  # Nothing after this can work: ship the logs and end.
  ls -la /var/lib/kubelet/plugins_registry "$PDIR" > "$CL_LOG/sockets.txt" 2>&1
  lab_file sockets.txt "$CL_LOG/sockets.txt"
  cluster_end
  exit 1
fi

# The plugin's own slices, on the API server (not `dra slices | kubectl apply`).
slices_json() { kc get resourceslices.v1.resource.k8s.io --field-selector "spec.nodeName=$CL_NODE,spec.driver=$DRIVER" -o json; }
if cl_wait 180 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get resourceslices --field-selector spec.nodeName=$CL_NODE,spec.driver=$DRIVER -o jsonpath='{.items[*].spec.devices[*].name}' | grep -qw $DEV"; then
  slices_json > "$CL_LOG/slices.json"
  lab_file slices.json "$CL_LOG/slices.json"
  lab_pass slices-published "$(kc get resourceslices --field-selector "spec.nodeName=$CL_NODE,spec.driver=$DRIVER" -o jsonpath='{range .items[*]}{.metadata.name} gen {.spec.pool.generation}: {.spec.devices[*].name}; {end}') after $(cl_since "$t") s; $(grep 'published the ResourceSlices' "$CL_LOG/dra-plugin.log" | tail -1 | sed 's/.*published/published/')"
else
  lab_fail slices-published "no $DEV in this node's slices: $(grep -E 'ResourceSlices|WARN' "$CL_LOG/dra-plugin.log" | tail -2 | tr '\n' '|')"
fi
# What gpupass does not offer is absent from the slices, and `dra slices --explain` says why.
gpupass dra slices --explain > "$CL_LOG/explain.txt" 2>&1
lab_file explain.txt "$CL_LOG/explain.txt"
refused=$(grep -c 'not published:' "$CL_LOG/explain.txt")
published=$(kc get resourceslices --field-selector "spec.nodeName=$CL_NODE,spec.driver=$DRIVER" -o jsonpath='{.items[*].spec.devices[*].name}' | wc -w)
groups=$(grep -cE '^[0-9]+ +pci-' "$CL_LOG/explain.txt")
# The mdev types' slots: the table after "MDEV PARENT", third column.
slots=$(awk '/^MDEV PARENT/ {m=1; next} m && NF == 3 && $3 ~ /^[0-9]+$/ {s += $3} END {print s + 0}' "$CL_LOG/explain.txt")
offered=$((groups + slots))
if [ "$refused" -gt 0 ] && [ "$published" = "$offered" ]; then
  lab_pass refused-not-published "$groups groups + $slots mdev slots offered = $published devices on the API server; $refused not published, each with its reason (explain.txt): $(grep 'not published:' "$CL_LOG/explain.txt" | head -1 | sed 's/^ *//')"
else
  lab_fail refused-not-published "explain: $groups groups + $slots mdev slots offered, $refused refused; the API server has $published devices"
fi

# contrib/dra as shipped: the API server's own validation (CEL compiled, names, configs).
if kc apply -f "$CL/dra/deviceclass.yaml" > "$CL_LOG/apply.txt" 2>&1 &&
  kc apply -f "$CL/dra/claim-examples.yaml" >> "$CL_LOG/apply.txt" 2>&1; then
  lab_pass manifests-applied "$(tr '\n' ';' < "$CL_LOG/apply.txt")"
else
  lab_fail manifests-applied "$(tr '\n' ';' < "$CL_LOG/apply.txt")"
fi

# pod NAME TEMPLATE: cl_claim_pod (lab/cluster/guest.sh).
pod() { cl_claim_pod "$@"; }
claim_of() { kc get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}'; }
# run_claim PREFIX NAME TEMPLATE: the claim allocated, the Pod running with the group on
# vfio-pci, its log in $CL_LOG/NAME.txt.
run_claim() {
  _t=$(cl_t)
  pod "$2" "$3"
  if cl_wait 300 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get resourceclaim \$(kubectl --kubeconfig $CL/admin.kubeconfig get pod $2 -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}') -o jsonpath='{.status.allocation.devices.results[*].device}' | grep -qx $DEV"; then
    _c=$(claim_of "$2")
    lab_pass "$1-claim-allocated" "claim $_c: $(kc get resourceclaim "$_c" -o jsonpath='{range .status.allocation.devices.results[*]}{.driver}/{.pool}/{.device} (request {.request}){end}') by the scheduler after $(cl_since "$_t") s"
  else
    lab_fail "$1-claim-allocated" "$(kc get resourceclaims -o jsonpath='{range .items[*]}{.metadata.name}: {.status}; {end}' 2>&1 | tail -1 | cut -c1-400)"
  fi
  if cl_wait 600 sh -c "crictl ps -a --label io.kubernetes.pod.name=$2 -q | grep -q . && crictl logs \$(crictl ps -a --label io.kubernetes.pod.name=$2 -q | head -1) 2>&1 | grep -qx READY"; then
    lab_pass "$1-pod-running" "after $(cl_since "$_t") s"
  else
    lab_fail "$1-pod-running" "$(kc get events --field-selector involvedObject.name="$2" -o jsonpath='{range .items[*]}{.reason}: {.message}; {end}' 2>&1 | tail -1 | cut -c1-600)"
  fi
  cl_logs "$2" > "$CL_LOG/$2.txt"
  lab_file "$2.txt" "$CL_LOG/$2.txt"
  kc get resourceclaim "$(claim_of "$2")" -o yaml > "$CL_LOG/$2-claim.yaml" 2>&1
  lab_file "$2-claim.yaml" "$CL_LOG/$2-claim.yaml"
}
# end_claim PREFIX NAME: the Pod deleted, the kubelet's Unprepare puts the group back.
end_claim() {
  _t=$(cl_t)
  _c=$(claim_of "$2")
  if kc delete pod "$2" --wait=true --timeout=300s > /dev/null 2>&1; then
    lab_pass "$1-pod-deleted" "after $(cl_since "$_t") s"
  else
    lab_fail "$1-pod-deleted" "$(kc get pod "$2" -o jsonpath='{.status.phase}' 2>&1)"
  fi
  if cl_wait 300 sh -c "[ \"\$(basename \$(readlink /sys/bus/pci/devices/$VGA/driver) 2>/dev/null) \$(basename \$(readlink /sys/bus/pci/devices/$AUD/driver) 2>/dev/null)\" = \"$before_vga $before_aud\" ]"; then
    lab_pass "$1-group-restored" "$VGA $before_vga, $AUD $before_aud again after $(cl_since "$_t") s; $(grep "unprepare\|Unprepare" "$CL_LOG/dra-plugin.log" | tail -1 | cut -c1-200)"
  else
    lab_fail "$1-group-restored" "drivers now $(group_drivers), expected $before_vga $before_aud; $(grep -E 'WARN|ERROR' "$CL_LOG/dra-plugin.log" | tail -1)"
  fi
  cl_wait 120 sh -c "! kubectl --kubeconfig $CL/admin.kubeconfig get resourceclaim $_c" || true
}

# 1. The shipped lab-vga template: the scheduler matches 1234:1111 with groupSize 2 (CEL),
# backendPolicy legacy from its opaque config.
run_claim legacy dra-legacy lab-vga
lab_expect legacy-group-on-vfio "vfio-pci vfio-pci" "$(group_drivers)"
if grep -qx "open OK /dev/vfio/$g" "$CL_LOG/dra-legacy.txt" && grep -qx "open OK /dev/vfio/vfio" "$CL_LOG/dra-legacy.txt" &&
  ! grep -q 'open FAILED' "$CL_LOG/dra-legacy.txt" && ! grep -q '^open OK /dev/iommu' "$CL_LOG/dra-legacy.txt"; then
  lab_pass legacy-opens "/dev/vfio/$g and /dev/vfio/vfio open in the container, no /dev/iommu (one backend)"
else
  lab_fail legacy-opens "$(tr '\n' ';' < "$CL_LOG/dra-legacy.txt" | cut -c1-600)"
fi
# KEP-5304: the device's metadata file in the container names the PCI address.
if grep -q 'resource.kubernetes.io/pciBusID":{"string":"'"$VGA"'"' "$CL_LOG/dra-legacy.txt"; then
  lab_pass legacy-metadata "$(grep '^metadata ' "$CL_LOG/dra-legacy.txt" | head -2 | tr '\n' ' ')"
else
  lab_fail legacy-metadata "no metadata file with pciBusID $VGA in the container: $(ls -R $PDIR 2>&1 | head -20 | tr '\n' ' ')"
fi
# Health that never goes stale (#45): the kubelet turns a device Unknown when the plugin's
# health stream says nothing of it within its health_check_timeout_seconds (30 s; the plugin
# sends the full list every 10 s). After 40 quiet seconds the Pod's allocatedResourcesStatus
# (ResourceHealthStatus, beta and on in 1.37) must still say Healthy for the claim's device.
t=$(cl_t)
sleep 40
hs=$(kc get pod dra-legacy -o jsonpath='{range .status.containerStatuses[*].allocatedResourcesStatus[*]}{.name}: {range .resources[*]}{.resourceID}={.health} {end}{end}' 2>&1)
case $hs in
  *"$DEV=Healthy"*) lab_pass legacy-health-stays "after $(cl_since "$t") s with nothing changed: $hs" ;;
  *) lab_fail legacy-health-stays "after $(cl_since "$t") s: allocatedResourcesStatus '$hs', want $DEV=Healthy" ;;
esac
# One owner per group (#45): the journal records the claim as the group's holder, so the host's
# `gpupass unbind --all` refuses to take the group from under the running Pod, naming the claim,
# and changes nothing.
gpupass unbind --all > "$CL_LOG/host-unbind.txt" 2>&1
rc=$?
lab_file host-unbind.txt "$CL_LOG/host-unbind.txt"
if [ "$rc" != 0 ] && grep -q "held by claim default/$(claim_of dra-legacy)" "$CL_LOG/host-unbind.txt" &&
  [ "$(group_drivers)" = "vfio-pci vfio-pci" ]; then
  lab_pass legacy-host-unbind-refused "exit $rc, $(grep -m1 'held by claim' "$CL_LOG/host-unbind.txt" | cut -c1-200); group still $(group_drivers)"
else
  lab_fail legacy-host-unbind-refused "exit $rc, drivers $(group_drivers): $(tr '\n' ';' < "$CL_LOG/host-unbind.txt" | cut -c1-400)"
fi
end_claim legacy dra-legacy

# 1b. A mediated device (KEP-4815 counters): the mtty sample parent is a counter set on the API
# server with one counter per type (its available instances); the shipped lab-mtty template
# (class mdev.vfio.gpupass.dev, CEL on mdevType) is allocated one mtty-2 slot; Prepare creates
# the instance through the engine, the container opens its VFIO nodes and reads its mdevUUID
# (KubeVirt's key); Unprepare removes it and the type's count is back.
MTYPE=/sys/class/mdev_bus/mtty/mdev_supported_types/mtty-2
avail_before=$(cat $MTYPE/available_instances)
counter=$(kc get resourceslices --field-selector "spec.nodeName=$CL_NODE,spec.driver=$DRIVER" -o jsonpath="{.items[*].spec.sharedCounters[?(@.name=='mdev-mtty')].counters.mtty-2.value}")
consumers=$(kc get resourceslices --field-selector "spec.nodeName=$CL_NODE,spec.driver=$DRIVER" -o json | grep -c '"counterSet": "mdev-mtty"')
if [ -n "$counter" ] && [ "$counter" = "$avail_before" ] && [ "$consumers" -gt 0 ]; then
  lab_pass mdev-counters-published "counter set mdev-mtty: mtty-2 = $counter (the kernel's available_instances $avail_before); $consumers devices consume from it"
else
  lab_fail mdev-counters-published "counter mtty-2 '$counter', kernel $avail_before, consumers $consumers"
fi
t=$(cl_t)
pod dra-mdev lab-mtty
mslot=""
if cl_wait 300 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get resourceclaim \$(kubectl --kubeconfig $CL/admin.kubeconfig get pod dra-mdev -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}') -o jsonpath='{.status.allocation.devices.results[*].device}' | grep -q '^mdev-mtty-mtty-2-'"; then
  mslot=$(kc get resourceclaim "$(claim_of dra-mdev)" -o jsonpath='{.status.allocation.devices.results[0].device}')
  lab_pass mdev-claim-allocated "claim $(claim_of dra-mdev): $mslot by the scheduler after $(cl_since "$t") s"
else
  lab_fail mdev-claim-allocated "$(kc get resourceclaims -o jsonpath='{range .items[*]}{.metadata.name}: {.status}; {end}' 2>&1 | tail -1 | cut -c1-400)"
fi
if cl_wait 600 sh -c "crictl ps -a --label io.kubernetes.pod.name=dra-mdev -q | grep -q . && crictl logs \$(crictl ps -a --label io.kubernetes.pod.name=dra-mdev -q | head -1) 2>&1 | grep -qx READY"; then
  lab_pass mdev-pod-running "after $(cl_since "$t") s"
else
  lab_fail mdev-pod-running "$(kc get events --field-selector involvedObject.name=dra-mdev -o jsonpath='{range .items[*]}{.reason}: {.message}; {end}' 2>&1 | tail -1 | cut -c1-600)"
fi
cl_logs dra-mdev > "$CL_LOG/dra-mdev.txt"
lab_file dra-mdev.txt "$CL_LOG/dra-mdev.txt"
muuid=$(ls $MTYPE/devices 2> /dev/null | head -1)
mgroup=$(basename "$(readlink "/sys/bus/mdev/devices/$muuid/iommu_group" 2> /dev/null)" 2> /dev/null)
avail_during=$(cat $MTYPE/available_instances)
if [ -n "$muuid" ] && [ -n "$mgroup" ] && [ "$avail_during" = $((avail_before - 1)) ] && grep -q "\"uuid\": *\"$muuid\"" "$PDIR/checkpoint.json"; then
  lab_pass mdev-instance-created "mdev $muuid (mtty-2, IOMMU group $mgroup) recorded in the checkpoint; available_instances $avail_before -> $avail_during"
else
  lab_fail mdev-instance-created "uuid '$muuid' group '$mgroup' available $avail_before -> $avail_during; checkpoint: $(tr -d '\n' < "$PDIR/checkpoint.json" | cut -c1-300)"
fi
mcdev=$(ls "/sys/bus/mdev/devices/$muuid/vfio-dev" 2> /dev/null | head -1)
if grep -qx "open OK /dev/vfio/$mgroup" "$CL_LOG/dra-mdev.txt" && grep -qx "open OK /dev/vfio/vfio" "$CL_LOG/dra-mdev.txt" &&
  ! grep -q 'open FAILED' "$CL_LOG/dra-mdev.txt" && ! grep -q '^open OK /dev/iommu' "$CL_LOG/dra-mdev.txt"; then
  lab_pass mdev-opens "legacy: /dev/vfio/$mgroup (the instance's group) and /dev/vfio/vfio open in the container"
elif [ -n "$mcdev" ] && grep -qx "open OK /dev/vfio/devices/$mcdev" "$CL_LOG/dra-mdev.txt" && grep -qx "open OK /dev/iommu" "$CL_LOG/dra-mdev.txt" &&
  ! grep -q 'open FAILED' "$CL_LOG/dra-mdev.txt" && ! grep -qx "open OK /dev/vfio/vfio" "$CL_LOG/dra-mdev.txt"; then
  lab_pass mdev-opens "iommufd: /dev/vfio/devices/$mcdev (the instance's cdev) and /dev/iommu open in the container, no /dev/vfio/vfio"
else
  lab_fail mdev-opens "group '$mgroup' cdev '$mcdev': $(tr '\n' ';' < "$CL_LOG/dra-mdev.txt" | cut -c1-600)"
fi
if [ -n "$muuid" ] && grep -q '"mdevUUID":{"string":"'"$muuid"'"' "$CL_LOG/dra-mdev.txt" && ! grep -q 'resource.kubernetes.io/pciBusID' "$CL_LOG/dra-mdev.txt"; then
  lab_pass mdev-metadata "the container's metadata file gives mdevUUID $muuid and no pciBusID"
else
  lab_fail mdev-metadata "no mdevUUID '$muuid' (or a pciBusID) in: $(grep -A1 '^metadata ' "$CL_LOG/dra-mdev.txt" | tr '\n' ' ' | cut -c1-400)"
fi
t=$(cl_t)
_c=$(claim_of dra-mdev)
if kc delete pod dra-mdev --wait=true --timeout=300s > /dev/null 2>&1; then
  lab_pass mdev-pod-deleted "after $(cl_since "$t") s"
else
  lab_fail mdev-pod-deleted "$(kc get pod dra-mdev -o jsonpath='{.status.phase}' 2>&1)"
fi
if cl_wait 300 sh -c "[ ! -e /sys/bus/mdev/devices/$muuid ] && [ \$(cat $MTYPE/available_instances) = $avail_before ]"; then
  lab_pass mdev-instance-removed "mdev $muuid gone, mtty-2 available_instances $avail_before again after $(cl_since "$t") s"
else
  lab_fail mdev-instance-removed "instance: $(ls /sys/bus/mdev/devices 2>&1 | tr '\n' ' '); available $(cat $MTYPE/available_instances); $(grep -E 'WARN|ERROR' "$CL_LOG/dra-plugin.log" | tail -1)"
fi
cl_wait 120 sh -c "! kubectl --kubeconfig $CL/admin.kubeconfig get resourceclaim $_c" || true

# policy_template NAME POLICY: a claim template for the VGA function whose opaque config sets
# backendPolicy POLICY (a value gpupass may not know), applied.
policy_template() {
  cat > "$1.yaml" << EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: $1, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: vfio
        exactly:
          deviceClassName: vfio.gpupass.dev
          selectors:
          - cel:
              expression: device.attributes["resource.kubernetes.io"].pciBusID == "$VGA"
      config:
      - requests: ["vfio"]
        opaque:
          driver: $DRIVER
          parameters: {apiVersion: gpupass.dev/v1alpha1, kind: VfioConfig, backendPolicy: $2}
EOF
  kc apply -f "$1.yaml" > /dev/null
}

# 2. A template of our own with no config: the plugin's --backend auto, iommufd on 6.12;
# legacy on 6.1, whose kernel has no iommufd (one backend for the node: no /dev/iommu, no cdev).
cat > auto-template.yaml << EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: lab-vga-auto, namespace: default}
spec:
  spec:
    devices:
      requests:
      - name: vfio
        exactly:
          deviceClassName: vfio.gpupass.dev
          selectors:
          - cel:
              expression: device.attributes["resource.kubernetes.io"].pciBusID == "$VGA" && device.attributes["gpupass.dev"].members == "$VGA,$AUD"
EOF
kc apply -f auto-template.yaml > /dev/null
if [ "$LAB_KERNEL" = 6.12 ]; then
  run_claim iommufd dra-iommufd lab-vga-auto
  cdev=$(ls /sys/bus/pci/devices/$VGA/vfio-dev 2> /dev/null)
  if [ -n "$cdev" ] && grep -qx "open OK /dev/vfio/devices/$cdev" "$CL_LOG/dra-iommufd.txt" &&
    grep -qx "open OK /dev/iommu" "$CL_LOG/dra-iommufd.txt" && ! grep -q 'open FAILED' "$CL_LOG/dra-iommufd.txt" &&
    ! grep -qx "open OK /dev/vfio/vfio" "$CL_LOG/dra-iommufd.txt"; then
    lab_pass iommufd-opens "/dev/vfio/devices/$cdev and /dev/iommu open, no /dev/vfio/vfio (one backend); drivers $(group_drivers)"
  else
    lab_fail iommufd-opens "cdev '$cdev', drivers $(group_drivers): $(tr '\n' ';' < "$CL_LOG/dra-iommufd.txt" | cut -c1-600)"
  fi
  end_claim iommufd dra-iommufd
else
  run_claim auto dra-auto lab-vga-auto
  backend=$(kc get resourceslices --field-selector "spec.nodeName=$CL_NODE,spec.driver=$DRIVER" -o jsonpath="{.items[*].spec.devices[?(@.name=='$DEV')].attributes.gpupass\.dev/backend.string}")
  if [ "$backend" = legacy ] && grep -qx "open OK /dev/vfio/$g" "$CL_LOG/dra-auto.txt" && grep -qx "open OK /dev/vfio/vfio" "$CL_LOG/dra-auto.txt" &&
    ! grep -q 'open FAILED' "$CL_LOG/dra-auto.txt" && ! grep -q '^open OK /dev/iommu' "$CL_LOG/dra-auto.txt" &&
    ! grep -q '^open OK /dev/vfio/devices/' "$CL_LOG/dra-auto.txt"; then
    lab_pass auto-opens "kernel $(uname -r): the slice says backend $backend; /dev/vfio/$g and /dev/vfio/vfio open, no /dev/iommu, no cdev; drivers $(group_drivers)"
  else
    lab_fail auto-opens "slice backend '$backend', drivers $(group_drivers): $(tr '\n' ';' < "$CL_LOG/dra-auto.txt" | cut -c1-600)"
  fi
  end_claim auto dra-auto
  # 2b. require-iommufd on this kernel: Prepare refuses before the first write, with the
  # kernel's reason in the Pod's events; the group never leaves its drivers (sampled every 2 s
  # while the kubelet retries) and the journal holds nothing.
  policy_template lab-vga-iommufd require-iommufd
  t=$(cl_t)
  pod dra-require lab-vga-iommufd
  ev() { kc get events --field-selector involvedObject.name=dra-require -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}' 2> /dev/null; }
  seen="" i=0
  while [ $i -lt 150 ] && ! ev | grep -q 'require-iommufd'; do
    seen="$seen $(group_drivers | tr ' ' '+')"
    sleep 2
    i=$((i + 1))
  done
  if ev | grep -q 'require-iommufd'; then
    lab_pass require-iommufd-event "after $(cl_since "$t") s: $(ev | grep 'require-iommufd' | head -1 | cut -c1-400)"
  else
    lab_fail require-iommufd-event "$(ev | tr '\n' ';' | cut -c1-600)"
  fi
  # The kubelet's retries go on: sample them for 10 s more.
  i=0
  while [ $i -lt 5 ]; do
    seen="$seen $(group_drivers | tr ' ' '+')"
    sleep 2
    i=$((i + 1))
  done
  moved=$(echo "$seen" | tr ' ' '\n' | grep -v '^$' | grep -cvx "$before_vga+$before_aud")
  uid=$(kc get resourceclaim "$(claim_of dra-require)" -o jsonpath='{.metadata.uid}')
  gpupass recover --dry-run > "$CL_LOG/require-recover.txt" 2>&1
  if [ "$moved" = 0 ] && [ "$(group_drivers)" = "$before_vga $before_aud" ] && grep -q 'nothing to recover' "$CL_LOG/require-recover.txt" &&
    [ -n "$uid" ] && ! grep -q "$uid" "$PDIR/checkpoint.json" 2> /dev/null; then
    lab_pass require-iommufd-untouched "$(echo "$seen" | wc -w) samples of the group's drivers while the kubelet retried, all '$before_vga $before_aud'; claim $uid not in the checkpoint; journal: $(head -1 "$CL_LOG/require-recover.txt")"
  else
    lab_fail require-iommufd-untouched "uid '$uid'; drivers sampled:$seen; now $(group_drivers); recover: $(tr '\n' ' ' < "$CL_LOG/require-recover.txt" | cut -c1-200)"
  fi
  kc delete pod dra-require --wait=true --timeout=300s > /dev/null 2>&1
fi

# 3. A claim whose opaque config has a value gpupass does not know: Prepare refuses with the
# reason, the kubelet reports it in the Pod's events, the group is not touched.
policy_template lab-vga-bad fastest
t=$(cl_t)
pod dra-bad lab-vga-bad
if cl_wait 300 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get events --field-selector involvedObject.name=dra-bad -o jsonpath='{range .items[*]}{.message}{\"\\n\"}{end}' | grep -q fastest"; then
  lab_pass bad-config-event "after $(cl_since "$t") s: $(kc get events --field-selector involvedObject.name=dra-bad -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}' | grep fastest | head -1 | cut -c1-400)"
else
  lab_fail bad-config-event "$(kc get events --field-selector involvedObject.name=dra-bad -o jsonpath='{range .items[*]}{.reason}: {.message}; {end}' 2>&1 | cut -c1-600)"
fi
lab_expect bad-config-untouched "$before_vga $before_aud" "$(group_drivers)"
kc delete pod dra-bad --wait=true --timeout=300s > /dev/null 2>&1

# 4. The API server unreachable: the node's routes to the host removed for a while. A host
# change meanwhile (00:07.0 bound: a function on vfio-pci is offered) cannot be published; the
# plugin says so and retries; with the routes back the slices show the change, and the node
# is Ready again (nothing restarted).
TD=0000:00:07.0
TDEV=pci-0000-00-07-0
offered_names() { kc get resourceslices --field-selector "spec.nodeName=$CL_NODE,spec.driver=$DRIVER" -o jsonpath='{.items[*].spec.devices[*].name}'; }
offers() { offered_names | tr ' ' '\n' | grep -qx "$1"; }
t=$(cl_t)
warns=$(grep -c 'cannot publish the ResourceSlices' "$CL_LOG/dra-plugin.log")
ip route del default 2> /dev/null
ip route del 10.0.2.0/24 dev "$CL_NODE_NIC" 2> /dev/null
gpupass bind "$TD" > "$CL_LOG/td-bind.txt" 2>&1
if cl_wait 90 sh -c "[ \$(grep -c 'cannot publish the ResourceSlices' $CL_LOG/dra-plugin.log) -gt $warns ]"; then
  lab_pass api-down-said "after $(cl_since "$t") s: $(grep 'cannot publish the ResourceSlices' "$CL_LOG/dra-plugin.log" | tail -1 | sed 's/.*cannot publish/cannot publish/' | cut -c1-300)"
else
  lab_fail api-down-said "no warning in 90 s; bind: $(tail -1 "$CL_LOG/td-bind.txt"); plugin: $(tail -1 "$CL_LOG/dra-plugin.log")"
fi
sleep 5
ip route add 10.0.2.0/24 dev "$CL_NODE_NIC" src "$CL_NODE_IP" 2> /dev/null
ip route add default via "$CL_HOST_IP" dev "$CL_NODE_NIC" 2> /dev/null
t=$(cl_t)
if cl_wait 180 offers "$TDEV"; then
  lab_pass api-back-republished "$TDEV (bound while the API server was unreachable) offered on the API server $(cl_since "$t") s after the routes came back; $(grep 'published the ResourceSlices' "$CL_LOG/dra-plugin.log" | tail -1 | sed 's/.*published/published/')"
else
  lab_fail api-back-republished "$TDEV not offered: $(offered_names); plugin: $(tail -1 "$CL_LOG/dra-plugin.log")"
fi
if cl_wait 300 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get node $CL_NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"; then
  lab_pass api-back-node-ready "$CL_NODE Ready $(cl_since "$t") s after the routes came back"
else
  lab_fail api-back-node-ready "$(kc get node "$CL_NODE" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}; {end}' 2>&1 | tail -1)"
fi
gpupass unbind "$TD" > "$CL_LOG/td-unbind.txt" 2>&1 || lab_fail api-back-unbind "$(tail -1 "$CL_LOG/td-unbind.txt")"

# 5. The plugin dies inside a Prepare (the test kit's GPUPASS_CRASH_AFTER_WRITE=3: abort()
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
pod dra-crash lab-vga
if cl_wait 300 sh -c "grep -q 'GPUPASS_CRASH_AFTER_WRITE=3: aborting now' $CL_LOG/dra-plugin-crash.log && ! kill -0 $(cat "$CL_RUN/dra-plugin-crash.pid")"; then
  lab_pass crash-plugin-died "in the Prepare of claim $(claim_of dra-crash), $(cl_since "$t") s after the Pod was created; drivers then $(group_drivers)"
else
  lab_fail crash-plugin-died "$(tail -2 "$CL_LOG/dra-plugin-crash.log" | tr '\n' '|' | cut -c1-400)"
fi
gpupass recover --dry-run > "$CL_LOG/crash-recover.txt" 2>&1
if grep -q "for dra-claim:$(kc get resourceclaim "$(claim_of dra-crash)" -o jsonpath='{.metadata.uid}')" "$CL_LOG/crash-recover.txt"; then
  lab_pass crash-left-open "$(grep 'unfinished' "$CL_LOG/crash-recover.txt" | head -1 | cut -c1-300)"
else
  lab_fail crash-left-open "$(tr '\n' ' ' < "$CL_LOG/crash-recover.txt" | cut -c1-400)"
fi
t=$(cl_t)
# shellcheck disable=SC2086
cl_start dra-plugin-restarted gpupass $plugin_args
if cl_wait 120 grep -q "interrupted before this start was undone" "$CL_LOG/dra-plugin-restarted.log"; then
  lab_pass crash-undone "$(grep -A3 'interrupted before this start was undone' "$CL_LOG/dra-plugin-restarted.log" | sed 's/.*INFO[^:]*: //' | tr '\n' ' ' | cut -c1-400)"
else
  lab_fail crash-undone "$(tail -3 "$CL_LOG/dra-plugin-restarted.log" | tr '\n' '|' | cut -c1-400)"
fi
if cl_wait 600 sh -c "crictl ps -a --label io.kubernetes.pod.name=dra-crash -q | grep -q . && crictl logs \$(crictl ps -a --label io.kubernetes.pod.name=dra-crash -q | head -1) 2>&1 | grep -qx READY"; then
  lab_pass crash-retry-running "the kubelet's retry prepared the claim; the Pod runs $(cl_since "$t") s after the restart, drivers $(group_drivers)"
else
  lab_fail crash-retry-running "$(kc get events --field-selector involvedObject.name=dra-crash -o jsonpath='{range .items[*]}{.reason}: {.message}; {end}' 2>&1 | tail -1 | cut -c1-600)"
fi
end_claim crash dra-crash

# Nothing left: no claim in the checkpoint, no unfinished plan in the journal.
if cl_wait 60 sh -c "! grep -q '\"uid\"' $PDIR/checkpoint.json 2>/dev/null"; then
  lab_pass checkpoint-empty "$(cat "$PDIR/checkpoint.json" 2> /dev/null | tr -d '\n' | cut -c1-200)"
else
  lab_fail checkpoint-empty "$(cat "$PDIR/checkpoint.json" | tr -d '\n' | cut -c1-400)"
fi
gpupass recover --dry-run > "$CL_LOG/recover.txt" 2>&1
if grep -q 'nothing to recover' "$CL_LOG/recover.txt"; then
  lab_pass journal-empty "$(tr '\n' ' ' < "$CL_LOG/recover.txt")"
else
  lab_fail journal-empty "$(tr '\n' ' ' < "$CL_LOG/recover.txt" | cut -c1-400)"
fi

t=$(cl_t)
_p=$(cat "$CL_RUN/dra-plugin-restarted.pid")
kill "$_p"
if cl_wait 30 sh -c "! kill -0 $_p"; then
  lab_pass plugin-stop "stopped on SIGTERM in $(cl_since "$t") s, sockets removed: $(ls $PDIR /var/lib/kubelet/plugins_registry 2>&1 | tr '\n' ' ')"
else
  lab_fail plugin-stop "still running 30 s after SIGTERM"
fi
cluster_end
