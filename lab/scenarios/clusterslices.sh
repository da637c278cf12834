# lab-about: what the cluster knows of gpupass's devices over time (docs/dra.md, "Slices resynced", "Health signals", "Taints"), on the real kubelet, scheduler and API server: the kubelet restarted (it wipes the node's slices) and a slice deleted by hand, each back within seconds and a new claim allocated and prepared after the restart; nothing written when nothing differs (the API server's own request counters); a prepared function unbound behind gpupass's back Unhealthy in the Pod's allocatedResourcesStatus and Healthy again when restored; a function that lost its host driver tainted NoSchedule: a claim without a toleration stays Pending with the scheduler's reason, one with the toleration gets the device and runs, the taint gone when the driver is back. The guest runs the commands and ships their output; tests/it/labjudge/clusterslices.rs judges them
# lab-needs: gpupass
# lab-carry: cluster
# lab-mem: 2048
# lab-smp: 2
# lab-cgroup: v2
# lab-modules: 9pnet_virtio
# lab-modules: 9p
# lab-modules: overlay
# lab-modules: virtio_net
# lab-timeout: 1200
# lab-judge: rust
#
# Judged in Rust (docs/lab.md, "Judged scenarios"): this script decides nothing. It runs each
# command under `lab_cmd NAME` and ships what it read itself (times, drivers) with `lab_facts
# NAME`; the judge (tests/it/labjudge/clusterslices.rs) decides every step. The waits below only
# bound how long the guest looks; each records what it saw and when.
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

# slices NAME: this node's slices of the driver as JSON (NAME.out).
slices() { lab_cmd "$1" kc get resourceslices --field-selector "$SEL" -o json; }
# uids: the UIDs of this node's slices that hold $DEV, one line.
uids() { kc get resourceslices --field-selector "$SEL" -o jsonpath='{range .items[*]}{.metadata.uid}={.spec.devices[*].name};{end}' 2> /dev/null | tr ';' '\n' | grep -w "$DEV" | cut -d= -f1 | tr '\n' ' '; }
# drivers: "VGA-driver AUD-driver" (none when unbound).
drivers() { echo "$(lab_driver $VGA || echo none) $(lab_driver $AUD || echo none)"; }
# waited NAME T0 SECONDS CMD...: CMD until it succeeds (every second), at most SECONDS; ships
# NAME.facts with ok=1|0 and the seconds since T0.
waited() {
  _wn=$1 _wt=$2 _end=$(( $(cut -d. -f1 /proc/uptime) + $3 )); shift 3
  _ok=0
  while [ "$(cut -d. -f1 /proc/uptime)" -le "$_end" ]; do
    if "$@" > /dev/null 2>&1; then _ok=1; break; fi
    sleep 1
  done
  lab_facts "$_wn" "ok=$_ok" "seconds=$(cl_since "$_wt")" "drivers=$(drivers)"
}
# metrics NAME: the API server's request counters for resourceslices (NAME.out).
metrics() { lab_cmd "$1" sh -c "$K get --raw /metrics | grep '^apiserver_request_total{.*resource=\"resourceslices\"'"; }
# has_dev: this node's slices hold $DEV.
has_dev() { kc get resourceslices --field-selector "$SEL" -o jsonpath='{.items[*].spec.devices[*].name}' | grep -qw "$DEV"; }
# pod_ready NAME: the Pod's container printed READY.
pod_ready() {
  _c=$(crictl ps -a --label "io.kubernetes.pod.name=$1" -q | head -1)
  [ -n "$_c" ] && crictl logs "$_c" 2>&1 | grep -qx READY
}
claim_of() { kc get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}'; }
allocated() { kc get resourceclaim "$(claim_of "$1")" -o jsonpath='{.status.allocation.devices.results[*].device}' | grep -qx "$DEV"; }
# pod_state NAME: the Pod and its claim as JSON (NAME-pod.out, NAME-claim.out), its events.
pod_state() { # NAME [POD]: POD (default NAME) as NAME-pod, its claim and events
  lab_cmd "$1-pod" kc get pod "${2:-$1}" -o json
  lab_cmd "$1-claim" kc get resourceclaim "$(claim_of "${2:-$1}")" -o json
  lab_cmd "$1-events" kc get events --field-selector "involvedObject.name=${2:-$1}" -o json
}
# health_is NAME STATE: the Pod's allocatedResourcesStatus says $DEV=STATE.
health_is() {
  kc get pod "$1" -o jsonpath='{range .status.containerStatuses[*].allocatedResourcesStatus[*]}{range .resources[*]}{.resourceID}={.health} {end}{end}' | grep -q "$DEV=$2"
}
# gone NAME: the Pod deleted (the kubelet's Unprepare follows).
gone() {
  kc delete pod "$1" --wait=true --timeout=300s > /dev/null 2>&1
}

lab_facts start "vga.driver=$(lab_driver $VGA)" "aud.driver=$(lab_driver $AUD)" "group=$(lab_group $VGA)"
start_drivers=$(drivers)
start_vga=$(lab_driver $VGA)
# same_drivers: both functions on the drivers they started on; vga_back: the VGA function.
same_drivers() { [ "$(drivers)" = "$start_drivers" ]; }
vga_back() { [ "$(lab_driver $VGA)" = "$start_vga" ]; }

# 1. The plugin, registered, its slices published.
t=$(cl_t)
cl_start slices-plugin gpupass dra-plugin -v --node "$CL_NODE" --kubeconfig "$CL/admin.kubeconfig"
waited registered "$t" 240 grep -q "the kubelet registered $DRIVER" "$CL_LOG/slices-plugin.log"
waited published "$t" 120 has_dev
kc apply -f "$CL/dra/deviceclass.yaml" > /dev/null 2>&1
kc apply -f "$CL/dra/claim-examples.yaml" > /dev/null 2>&1
# The lab-vga template (contrib/dra/claim-examples.yaml) with a toleration of gpupass's taint:
# what a user who accepts a sick device writes.
cl_template lab-vga-tolerant vfio.gpupass.dev 'device.attributes["gpupass.dev"].vendorID == "1234" && device.attributes["gpupass.dev"].deviceID == "1111" && device.attributes["gpupass.dev"].groupSize == 2' legacy gpupass.dev/unhealthy
lab_cmd tolerant-template kc apply -f lab-vga-tolerant.yaml
slices slices-start
before=$(uids)

# 2. The kubelet killed and started again: it wipes the node's slices at its start; the plugin
# puts them back (new UIDs). Then a new claim is allocated and prepared on the node.
kill "$(cat "$CL_RUN/kubelet.pid")"
cl_wait 60 sh -c "! kill -0 $(cat "$CL_RUN/kubelet.pid") 2> /dev/null"
cp "$CL_LOG/kubelet.log" "$CL_LOG/kubelet-before-restart.log"
t=$(cl_t)
cl_kubelet
# Back: slices with $DEV whose UIDs are not the ones before.
back() { _u=$(uids); [ -n "$_u" ] && [ "$_u" != "$before" ]; }
waited kubelet-back "$t" 180 back
slices slices-after-kubelet
lab_facts kubelet-uids "before=$before" "after=$(uids)"
waited node-ready "$t" 300 sh -c "$K get node $CL_NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
t=$(cl_t)
cl_claim_pod after-restart lab-vga
waited after-restart-allocated "$t" 300 allocated after-restart
waited after-restart-running "$t" 600 pod_ready after-restart
pod_state after-restart
lab_cmd after-restart-log cl_logs after-restart
gone after-restart
waited after-restart-restored "$t" 300 same_drivers

# 3. A slice deleted by hand: back within seconds.
before=$(uids)
name=$(kc get resourceslices --field-selector "$SEL" -o jsonpath='{range .items[*]}{.metadata.name} {.spec.devices[*].name};{end}' | tr ';' '\n' | grep -w "$DEV" | cut -d' ' -f1)
t=$(cl_t)
lab_cmd delete-slice kc delete resourceslice "$name"
waited delete-back "$t" 120 back
slices slices-after-delete

# 4. Nothing written when nothing differs: the API server's counters of resourceslices writes
# over a quiet minute (the plugin re-reads the host every 0.5 s and sends health every 10 s).
sleep 10
metrics metrics-before
t=$(cl_t)
sleep 60
metrics metrics-after
lab_facts quiet "seconds=$(cl_since "$t")"

# 5. Health that reaches the Pod: a prepared function unbound behind gpupass's back.
t=$(cl_t)
cl_claim_pod health lab-vga
waited health-running "$t" 600 pod_ready health
waited health-healthy-first "$t" 120 health_is health Healthy
t=$(cl_t)
lab_cmd health-unbind sh -c "echo $AUD > /sys/bus/pci/drivers/vfio-pci/unbind"
waited health-unhealthy "$t" 120 health_is health Unhealthy
pod_state health-sick health
slices slices-health-sick
t=$(cl_t)
lab_cmd health-rebind sh -c "echo vfio-pci > /sys/bus/pci/devices/$AUD/driver_override; echo $AUD > /sys/bus/pci/drivers_probe"
waited health-recovered "$t" 120 health_is health Healthy
pod_state health-well health
slices slices-health-well
gone health
waited health-restored "$t" 300 same_drivers

# 6. Taints: the audio function loses its host driver (as a failed probe leaves it): the device
# is tainted; a claim without a toleration stays Pending, one with it gets the device.
aud_driver=$(lab_driver $AUD)
t=$(cl_t)
lab_cmd taint-unbind sh -c "echo $AUD > /sys/bus/pci/drivers/$aud_driver/unbind"
waited taint-published "$t" 120 sh -c "$K get resourceslices --field-selector $SEL -o jsonpath=\"{.items[*].spec.devices[?(@.name=='$DEV')].taints[*].value}\" | grep -q ."
slices slices-tainted
t=$(cl_t)
cl_claim_pod untolerated lab-vga
# The scheduler has looked and said why: the Pod's PodScheduled condition is False.
waited untolerated-unschedulable "$t" 180 sh -c "$K get pod untolerated -o jsonpath='{.status.conditions[?(@.type==\"PodScheduled\")].status}' | grep -qx False"
sleep 20
pod_state untolerated
t=$(cl_t)
cl_claim_pod tolerated lab-vga-tolerant
waited tolerated-allocated "$t" 300 allocated tolerated
waited tolerated-running "$t" 600 pod_ready tolerated
pod_state tolerated
lab_cmd tolerated-log cl_logs tolerated
lab_cmd untolerated-still kc get pod untolerated -o json
gone untolerated
gone tolerated
waited tolerated-restored "$t" 300 vga_back
t=$(cl_t)
# (The tolerated claim's Unprepare may have given the function a driver already: the
# kernel's probe after the override is cleared; then there is nothing to bind.)
lab_cmd taint-rebind sh -c "echo > /sys/bus/pci/devices/$AUD/driver_override; [ -e /sys/bus/pci/devices/$AUD/driver ] || echo $AUD > /sys/bus/pci/drivers/$aud_driver/bind"
waited taint-removed "$t" 120 sh -c "[ -z \"\$($K get resourceslices --field-selector $SEL -o jsonpath=\"{.items[*].spec.devices[?(@.name=='$DEV')].taints[*].value}\")\" ] && $K get resourceslices --field-selector $SEL -o jsonpath='{.items[*].spec.devices[*].name}' | grep -qw $DEV"
slices slices-end

# 7. The plugin stopped; its log shipped (cluster_end ships $CL_LOG/*.log).
kill -TERM "$(cat "$CL_RUN/slices-plugin.pid")"
cl_wait 30 sh -c "! kill -0 $(cat "$CL_RUN/slices-plugin.pid") 2> /dev/null"
lab_facts end "vga.driver=$(lab_driver $VGA)" "aud.driver=$(lab_driver $AUD)" "plugin.alive=$(cl_alive slices-plugin && echo 1 || echo 0)"
cluster_end
