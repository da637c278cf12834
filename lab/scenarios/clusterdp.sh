# lab-about: `gpupass device-plugin` against the real kubelet of the cluster lab (docs/cluster.md): it registers, the Node's allocatable shows the resource, a Pod asking for it is scheduled and its container opens the VFIO nodes it was given (legacy: the group node + /dev/vfio/vfio; iommufd: the cdev + /dev/iommu), a restarted plugin registers again and the second Pod gets the device the first one released
# lab-needs: gpupass
# lab-carry: cluster
# lab-mem: 2048
# lab-smp: 2
# lab-modules: overlay
# lab-modules: virtio_net
# lab-timeout: 600
# lab-steps: leg bind plugin-start resource-allocatable legacy-pod-succeeded legacy-opens
# lab-steps: legacy-env plugin-restart iommufd-pod-succeeded iommufd-opens
# lab-steps: kubelet-restart restart-pod-succeeded restart-opens
# lab-steps: midreg-failed-said midreg-registered midreg-pod-succeeded midreg-opens
# lab-steps: cdi-spec cdi-plugin cdi-pod-succeeded cdi-opens unbind teardown
#
# Run alone (lab/lab.sh --kernel 6.12 run clusterdp) or after `cluster` in the same boot
# (lab/lab.sh --kernel 6.12 run cluster clusterdp: the cluster stays up between them).
# shellcheck source=../cluster/guest.sh
. /lab/cluster/lib.sh
cluster_begin

D=0000:00:07.0
lab_check bind gpupass bind $D
g=$(lab_group $D)
cdev=$(ls /sys/bus/pci/devices/$D/vfio-dev 2> /dev/null)

# plugin_start BACKEND: the plugin in the background, its log in $CL_LOG/device-plugin-BACKEND.log.
plugin_start() {
  cl_start "device-plugin-$1" gpupass device-plugin -v --backend "$1"
}
plugin_stop() {
  _p=$(cat "$CL_RUN/device-plugin-$1.pid" 2> /dev/null) && kill "$_p" 2> /dev/null
  for _i in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$_p" 2> /dev/null || return 0; sleep 1; done
  return 1
}
# The extended resources the node reports (everything but cpu, memory, pods, storage, hugepages).
extended() {
  kc get node "$CL_NODE" -o jsonpath="{.status.$1}" | tr ',{}' '\n\n\n' |
    grep -v -E '^"(cpu|memory|pods|ephemeral-storage|hugepages-[^"]*)":' | grep . | tr -d '"'
}

t=$(cl_t)
plugin_start legacy
lab_pass plugin-start "gpupass device-plugin -v --backend legacy"
# The kubelet's device manager takes the registration and puts the resource in the Node's
# capacity/allocatable at its next status update.
if cl_wait 300 sh -c "[ -n \"\$(kubectl --kubeconfig $CL/admin.kubeconfig get node $CL_NODE -o jsonpath='{.status.allocatable}' | tr ',{}' '\n\n\n' | grep -v -E '^\"(cpu|memory|pods|ephemeral-storage|hugepages-[^\"]*)\":' | grep . )\" ]"; then
  res=$(extended allocatable | head -1)
  lab_pass resource-allocatable "$res after $(cl_since "$t") s"
else
  lab_fail resource-allocatable "no extended resource on the node; plugin log: $(tail -1 "$CL_LOG/device-plugin-legacy.log")"
  res=''
fi
name=${res%%:*}

# pod NAME: cl_resource_pod (lab/cluster/guest.sh) asking for one $name.
pod() { cl_resource_pod "$1" "$name"; }
# run_pod NAME STEP: creates it, waits for Succeeded, leaves its log in $CL_LOG/NAME.txt.
run_pod() {
  _t=$(cl_t)
  pod "$1"
  if cl_wait 600 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get pod $1 -o jsonpath='{.status.phase}' | grep -qx Succeeded"; then
    lab_pass "$2" "after $(cl_since "$_t") s"
  else
    lab_fail "$2" "phase $(kc get pod "$1" -o jsonpath='{.status.phase} {.status.conditions} {.status.containerStatuses}' 2>&1 | tail -1)"
  fi
  cl_logs "$1" > "$CL_LOG/$1.txt"
  cat "$CL_LOG/$1.txt"
  kc get pod "$1" -o yaml > "$CL_LOG/$1.yaml" 2>&1
  lab_file "$1.txt" "$CL_LOG/$1.txt"
}

run_pod vfio-legacy legacy-pod-succeeded
if grep -qx "open OK /dev/vfio/$g" "$CL_LOG/vfio-legacy.txt" && grep -qx "open OK /dev/vfio/vfio" "$CL_LOG/vfio-legacy.txt" &&
  ! grep -q 'open FAILED' "$CL_LOG/vfio-legacy.txt"; then
  lab_pass legacy-opens "/dev/vfio/$g and /dev/vfio/vfio open in the container"
else
  lab_fail legacy-opens "$(tr '\n' ';' < "$CL_LOG/vfio-legacy.txt")"
fi
lab_expect legacy-env "PCI_RESOURCE_$(echo "$name" | tr 'a-z./-' 'A-Z___')=$D" "$(grep '^PCI_RESOURCE' "$CL_LOG/vfio-legacy.txt")"
kc delete pod vfio-legacy --wait=true --timeout=180s > /dev/null 2>&1

# A restarted plugin registers again; now with the iommufd node set.
t=$(cl_t)
if plugin_stop legacy; then
  plugin_start iommufd
  if cl_wait 120 grep -q '^.*registered ' "$CL_LOG/device-plugin-iommufd.log"; then
    lab_pass plugin-restart "registered again after $(cl_since "$t") s"
  else
    lab_fail plugin-restart "no registration in the new plugin's log: $(tail -1 "$CL_LOG/device-plugin-iommufd.log")"
  fi
else
  lab_fail plugin-restart "the legacy plugin did not stop"
fi
run_pod vfio-iommufd iommufd-pod-succeeded
if [ -n "$cdev" ] && grep -qx "open OK /dev/vfio/devices/$cdev" "$CL_LOG/vfio-iommufd.txt" &&
  grep -qx "open OK /dev/iommu" "$CL_LOG/vfio-iommufd.txt" && ! grep -q 'open FAILED' "$CL_LOG/vfio-iommufd.txt"; then
  lab_pass iommufd-opens "/dev/vfio/devices/$cdev and /dev/iommu open in the container"
else
  lab_fail iommufd-opens "cdev '$cdev': $(tr '\n' ';' < "$CL_LOG/vfio-iommufd.txt")"
fi
kc delete pod vfio-iommufd --wait=true --timeout=180s > /dev/null 2>&1

# kubelet_back STEP LOG BEFORE T0: the kubelet started again with its device-plugins directory
# removed (the kubelet empties it at start; here the whole directory goes); STEP passes when the
# plugin logging to LOG registered again (more than BEFORE "registered" lines) and the Node's
# allocatable shows $name again.
kubelet_back() {
  rm -rf /var/lib/kubelet/device-plugins
  cp "$CL_LOG/kubelet.log" "$CL_LOG/kubelet-before-$1.log"
  cl_kubelet
  if cl_wait 300 sh -c "[ \$(grep -c 'registered ' $2) -gt $3 ]" &&
    cl_wait 300 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get node $CL_NODE -o jsonpath='{.status.allocatable}' | grep -q '$name'"; then
    lab_pass "$1" "registered again after $(cl_since "$4") s: $(grep -E 'was removed|recreated|registered ' "$2" | tail -3 | tr '\n' '|' | cut -c1-400)"
  else
    lab_fail "$1" "no new registration or no $name on the node: $(tail -3 "$2" | tr '\n' '|' | cut -c1-400)"
  fi
}
# pod_opens_cdev NAME PREFIX WHEN: a Pod (PREFIX-pod-succeeded) that opens the iommufd cdev
# (PREFIX-opens), then deleted.
pod_opens_cdev() {
  run_pod "$1" "$2-pod-succeeded"
  if grep -qx "open OK /dev/vfio/devices/$cdev" "$CL_LOG/$1.txt" && ! grep -q 'open FAILED' "$CL_LOG/$1.txt"; then
    lab_pass "$2-opens" "/dev/vfio/devices/$cdev opens in a Pod $3"
  else
    lab_fail "$2-opens" "$(tr '\n' ';' < "$CL_LOG/$1.txt")"
  fi
  kc delete pod "$1" --wait=true --timeout=180s > /dev/null 2>&1
}

# The kubelet restarted between registrations: the plugin sees kubelet.sock come back and its
# own socket gone, serves again and registers again; the Node shows the resource again and a
# Pod still gets the device. Never a plugin that looks registered and is not.
t=$(cl_t)
before=$(grep -c 'registered ' "$CL_LOG/device-plugin-iommufd.log")
kill "$(cat "$CL_RUN/kubelet.pid")"
cl_wait 60 sh -c "! kill -0 $(cat "$CL_RUN/kubelet.pid") 2> /dev/null"
kubelet_back kubelet-restart "$CL_LOG/device-plugin-iommufd.log" "$before" "$t"
pod_opens_cdev vfio-restarted restart "after the kubelet's restart"

# The kubelet restarted *during* a registration: the kubelet frozen (SIGSTOP), a restarted
# plugin's Register call gets no answer (the connection is accepted by the kernel, the
# kubelet never reads it); the kubelet then killed, so the answer never comes, and started
# again. The plugin must say its call got no answer, serve and register again; the Node shows
# the resource again and a Pod gets the device. Never a plugin that believes it registered.
kpid=$(cat "$CL_RUN/kubelet.pid")
plugin_stop iommufd
kill -STOP "$kpid"
cl_start device-plugin-midreg gpupass device-plugin -v --backend iommufd
# The plugin's own socket is there before it registers; then its call is in flight.
cl_wait 60 sh -c "ls /var/lib/kubelet/device-plugins | grep -q gpupass" || true
sleep 4
kill -KILL "$kpid"
cl_wait 60 sh -c "! kill -0 $kpid 2> /dev/null"
if cl_wait 60 grep -q 'retrying in' "$CL_LOG/device-plugin-midreg.log" && ! grep -q 'registered ' "$CL_LOG/device-plugin-midreg.log"; then
  lab_pass midreg-failed-said "$(grep 'retrying in' "$CL_LOG/device-plugin-midreg.log" | head -1 | sed 's/.*WARN[^:]*: //' | cut -c1-300)"
else
  lab_fail midreg-failed-said "$(tail -3 "$CL_LOG/device-plugin-midreg.log" | tr '\n' '|' | cut -c1-400)"
fi
kubelet_back midreg-registered "$CL_LOG/device-plugin-midreg.log" 0 "$(cl_t)"
pod_opens_cdev vfio-midreg midreg "after the interrupted registration"

# containerd's CDI with gpupass's own spec: the plugin (--cdi only) answers Allocate with the
# CDI device name alone, no device node and no environment of its own; the kubelet passes the
# name in the CRI's CDIDevices, and containerd (CDI on by default in 2.x, config's
# cdi_spec_dirs) makes every edit from the spec `gpupass cdi generate --write` put in
# /var/run/cdi: the nodes the container opens and its PCI_RESOURCE_* come from there.
t=$(cl_t)
plugin_stop midreg
lab_check cdi-spec gpupass cdi generate --write
spec=$(ls /var/run/cdi/gpupass* 2> /dev/null | head -1)
[ -n "$spec" ] && lab_file cdi-spec.json "$spec"
cl_start device-plugin-cdi gpupass device-plugin -v --backend legacy --cdi only
if cl_wait 120 grep -q '^.*registered ' "$CL_LOG/device-plugin-cdi.log"; then
  lab_pass cdi-plugin "gpupass device-plugin --cdi only registered after $(cl_since "$t") s"
else
  lab_fail cdi-plugin "no registration: $(tail -1 "$CL_LOG/device-plugin-cdi.log")"
fi
run_pod vfio-cdi cdi-pod-succeeded
if grep -qx "open OK /dev/vfio/$g" "$CL_LOG/vfio-cdi.txt" && grep -qx "open OK /dev/vfio/vfio" "$CL_LOG/vfio-cdi.txt" &&
  ! grep -q 'open FAILED' "$CL_LOG/vfio-cdi.txt" && grep -q "^PCI_RESOURCE_.*=$D\$" "$CL_LOG/vfio-cdi.txt"; then
  lab_pass cdi-opens "/dev/vfio/$g, /dev/vfio/vfio and $(grep '^PCI_RESOURCE' "$CL_LOG/vfio-cdi.txt") from $spec through containerd's CDI"
else
  lab_fail cdi-opens "$(tr '\n' ';' < "$CL_LOG/vfio-cdi.txt")"
fi
kc delete pod vfio-cdi --wait=true --timeout=180s > /dev/null 2>&1
plugin_stop cdi
lab_check unbind gpupass unbind $D

cluster_end
