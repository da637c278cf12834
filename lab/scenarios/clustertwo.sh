# lab-about: two nodes (docs/cluster.md, "Two nodes"): two 6.12 guests booted at once, the nodes lab and lab2, joined to one control plane on the host; gpupass installed as users install it, the image imported into both nodes' containerd and the chart installed with helm, its DaemonSet running the plugin on both, each node publishing its own pool; lab2 alone has an "AMD" display function (QEMU's ati-vga, 1002:5159, with an ICH6 HDA function in its slot), so a claim whose CEL selects vendorID 1002 is allocated on lab2 and its Pod runs there, a second Pod asking for the same group stays Pending with the scheduler's FailedScheduling reason, and a claim pinned to lab prepares lab's own 00:05 group; deleting the Pods unprepares each on its own node; then binding conditions across nodes: with lab's 00:05 held open by a host process, a Pod that prefers lab and matches the 00:05 group of either node fails binding on lab (InUse), lab's device is tainted gpupass.dev/busy, and the Pod runs on lab2; the taint goes with the holder; helm uninstall, and both nodes end with every function on its original driver. Judged in Rust (tests/it/labjudge/clustertwo.rs)
# lab-judge: rust
# lab-needs: gpupass
# lab-carry: cluster
# lab-carry: deploy
# lab-nodes: 2
# lab-mem: 1536
# lab-smp: 1
# lab-cgroup: v2
# lab-modules: 9pnet_virtio
# lab-modules: 9p
# lab-modules: overlay
# lab-modules: virtio_net
# lab-timeout: 2400
# The second guest's own devices: an ATI Radeon 7000 (ati-vga model rv100, 1002:5159, no driver in
# the lab kernel) and an ICH6 HD Audio function (intel-hda 8086:2668, snd_hda_intel) in one slot,
# 00:18.0 + 00:18.1: one IOMMU group, a GPU and its audio companion as 00:05 is.
# lab-qemu-node2: -device ati-vga,model=rv100,bus=pcie.0,addr=0x18.0x0,multifunction=on
# lab-qemu-node2: -audiodev none,id=snd2 -device intel-hda,bus=pcie.0,addr=0x18.0x1,id=hda2 -device hda-duplex,bus=hda2.0,audiodev=snd2
#
# Both guests run this script; lab/cluster/guest.sh names the node from the kernel command line.
# lab (the first guest) drives: it runs kubectl and every step on the API server. lab2 serves:
# its kubelet and plugin, and what only it can read (its sysfs, its containers' output through
# its CRI). They meet through the API server: lab writes the phase into the ConfigMap
# "clustertwo" (data.phase), lab2 ships what it sees at that phase and answers with data.ack.
# Nothing is decided here: the guests ship command outputs (lab_cmd) and what they read
# (lab_facts), and the judge decides every step. The cluster library's own bring-up lines go to
# cluster.txt (shipped for the record) instead of the data channel.
# shellcheck source=../cluster/guest.sh
. /lab/cluster/lib.sh

DRIVER=vfio.gpupass.dev
PDIR=/var/lib/kubelet/plugins/$DRIVER
CM=clustertwo
NS=gpupass-system
REL=gpupass
D=/opt/deploy
VGA=0000:00:05.0
CTR="ctr --address /run/containerd/containerd.sock -n k8s.io"
export HELM_CONFIG_HOME=/tmp/helm/config HELM_CACHE_HOME=/tmp/helm/cache HELM_DATA_HOME=/tmp/helm/data
helm() { "$D/helm" --kubeconfig "$CL/admin.kubeconfig" "$@"; }
# The functions whose drivers the judge follows: 00:05.x on both nodes, 00:18.x on lab2.
FUNCS="0000:00:05.0 0000:00:05.1"
[ "$CL_NODE" = lab2 ] && FUNCS="$FUNCS 0000:00:18.0 0000:00:18.1"

lab_result() {
  _step=$1 _st=$2
  shift 2
  echo "cluster: $_step $_st $*"
  echo "$_step $_st $*" >> /tmp/lab/clustertwo-cluster.txt
}
# The bring-up's (and teardown's) lines, for the record and the judge, however the script ends
# (cluster_begin exits when the bring-up fails).
: > /tmp/lab/clustertwo-cluster.txt
trap 'lab_file cluster.txt /tmp/lab/clustertwo-cluster.txt' EXIT

# node_facts NAME: every PCI function's driver ("drv.BDF=DRIVER", "none" without one), the
# groups of FUNCS, which of their VFIO nodes exist, and what gpupass left behind
# (checkpoint.json's claims).
node_facts() {
  _n=$1
  set -- "node=$CL_NODE"
  for _d in /sys/bus/pci/devices/*; do
    _b=${_d##*/}
    set -- "$@" "drv.$_b=$(lab_driver "$_b" || echo none)"
  done
  for _b in $FUNCS; do
    _g=$(lab_group "$_b")
    set -- "$@" "group.$_b=$_g"
    if [ -c "/dev/vfio/$_g" ]; then set -- "$@" "node.$_b=char"; else set -- "$@" "node.$_b=absent"; fi
  done
  set -- "$@" "checkpoint.claims=$(cat "$PDIR/checkpoint.json" 2> /dev/null | grep -c '"uid"')"
  lab_facts "$_n" "$@"
}

# logs_of POD: what the Pod's containers printed, through this node's CRI (cl_logs with crictl's
# timeout raised from its 2 s: two TCG guests on a loaded host answer slower than that).
logs_of() {
  for _cid in $(crictl --timeout 30s ps -a --label "io.kubernetes.pod.name=$1" -q 2> /dev/null); do
    crictl --timeout 30s logs "$_cid" 2>&1
  done
}
# said_ready POD: its container printed READY.
said_ready() { logs_of "$1" | grep -qx READY; }

# plugin_log: what the chart's plugin Pod on this node printed, through this node's CRI.
plugin_log() {
  for _cid in $(crictl --timeout 30s ps -a --label "io.kubernetes.pod.namespace=$NS" -q 2> /dev/null); do
    crictl --timeout 30s logs "$_cid" 2>&1
  done
}
plugin_registered() { plugin_log | grep -q "the kubelet registered $DRIVER"; }
# plugin_up [SECONDS]: the DaemonSet's Pod on this node has started and the kubelet registered
# it (its registration socket, and its log's line). The registration may take minutes under
# load: the kubelet gives GetInfo 1 s, and after each miss waits twice as long (up to about
# 2 minutes) before it asks again; on 2026-12-06, with five lab QEMUs on two cores, lab2's
# kubelet missed eight times in a row (docs/testing.md, "CI's time").
plugin_up() {
  cl_wait "${1:-600}" sh -c "[ -S /var/lib/kubelet/plugins_registry/$DRIVER-reg.sock ]" &&
    cl_wait 600 plugin_registered
}
# plugin_gone: no container of the chart's namespace runs on this node and the registration
# socket is gone (the plugin removes it on SIGTERM).
plugin_gone() {
  [ -z "$(crictl --timeout 30s ps --label "io.kubernetes.pod.namespace=$NS" -q 2> /dev/null)" ] &&
    [ ! -S "/var/lib/kubelet/plugins_registry/$DRIVER-reg.sock" ]
}

# template NAME CEL: NAME.yaml, a claim template (namespace default) of class vfio.gpupass.dev
# whose device the CEL expression selects (cl_template).
template() { cl_template "$1" vfio.gpupass.dev "$2"; }

# cm DATA: the ConfigMap's data.KEY.
cm() { kc get configmap "$CM" -o jsonpath="{.data.$1}" 2> /dev/null; }
cm_set() { kc patch configmap "$CM" --type merge -p "{\"data\":{\"$1\":\"$2\"}}" > /dev/null; }

cluster_begin
node_facts before
# Both nodes: the image deploy/image/build.sh made on the host (lab.sh carry_deploy), over 9p,
# into this node's containerd (no registry: the chart's pullPolicy Never).
mkdir -p $D
lab_cmd mount-deploy mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=524288 deploy $D
lab_cmd import $CTR images import --platform linux/amd64 $D/gpupass-lab-1.oci.tar

if [ "$CL_NODE" = lab2 ]; then
  # ---- lab2: serves, and ships what it sees at each phase lab asks for. --------------------
  # The plugin comes with the DaemonSet lab installs once both nodes are Ready.
  lab_cmd dra-up plugin_up 1200
  lab_cmd plugin-log plugin_log
  # Every 5 s (each kubectl call costs this one vCPU a second or more under TCG), until the
  # phase "end" or the boot's limit; 3600 s at most.
  done_phase='' p='' _i=0
  while :; do
    p=$(cm phase)
    if [ -z "$p" ] || [ "$p" = "$done_phase" ]; then
      _i=$((_i + 1))
      if [ $_i -gt 720 ]; then
        echo "clustertwo: no new phase from lab in 3600 s; stopping"
        break
      fi
      sleep 5
      continue
    fi
    case $p in
      held)
        # The Pod lab created runs here: its container's output, read through this node's CRI.
        cl_wait 300 said_ready two-amd
        lab_cmd held-amd-log logs_of two-amd
        node_facts held
        ;;
      released)
        # The Pod is gone: the kubelet's Unprepare gave 00:18.x back (waited for, up to 180 s).
        cl_wait 180 sh -c "[ \"\$(basename \$(readlink /sys/bus/pci/devices/0000:00:18.1/driver) 2>/dev/null)\" = snd_hda_intel ] && [ ! -e /sys/bus/pci/devices/0000:00:18.0/driver ]"
        node_facts released
        lab_cmd released-recover gpupass recover --dry-run
        ;;
      busy)
        # lab's 00:05 is held; the Pod that preferred lab runs here, on lab2's own 00:05.
        cl_wait 600 said_ready two-busy
        lab_cmd busy-log logs_of two-busy
        node_facts busy
        ;;
      busy-released)
        cl_wait 180 sh -c "[ \"\$(basename \$(readlink /sys/bus/pci/devices/0000:00:05.0/driver) 2>/dev/null)\" = bochs-drm ] && [ \"\$(basename \$(readlink /sys/bus/pci/devices/0000:00:05.1/driver) 2>/dev/null)\" = snd_hda_intel ]"
        node_facts busy-released
        lab_cmd busy-recover gpupass recover --dry-run
        ;;
      end)
        # helm uninstall took the DaemonSet's Pod off this node too.
        lab_cmd plugin-stop cl_wait 180 plugin_gone
        lab_cmd end-plugin-log plugin_log
        node_facts end
        cm_set ack "$p"
        break
        ;;
    esac
    cm_set ack "$p"
    done_phase=$p
  done
  cl_files
  cluster_down
  exit 0
fi

# ---- lab: drives. ------------------------------------------------------------------------------
# phase P: lab2 ships what it sees at P; 0 once it answered (up to 600 s).
phase() {
  cm_set phase "$1"
  cl_wait 600 sh -c "[ \"\$(kubectl --kubeconfig $CL/admin.kubeconfig get configmap $CM -o jsonpath='{.data.ack}')\" = '$1' ]"
}
kc create configmap "$CM" --from-literal=phase=start > /dev/null 2>&1

# Both nodes Ready, then the chart: its DaemonSet runs the plugin on both; both pools published
# (lab2's with its 00:18.0 group).
cl_wait 900 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get node lab2 -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
lab_cmd nodes kc get nodes -o json
# The lab's values (lab/cluster/guest.sh, as clusterhelm's).
cl_lab_values lab-values.yaml
lab_file lab-values.yaml lab-values.yaml
# lab2 imported the image too (its kubelet lists it in the node's status): the DaemonSet's Pod
# there finds it, with pullPolicy Never.
cl_wait 600 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get node lab2 -o jsonpath='{.status.images[*].names}' | grep -q gpupass.dev/gpupass:lab-1"
lab_cmd helm-install helm install $REL $D/chart --namespace $NS --create-namespace -f lab-values.yaml
lab_cmd dra-up plugin_up 900
lab_cmd plugin-log plugin_log
cl_wait 300 sh -c "[ \"\$(kubectl --kubeconfig $CL/admin.kubeconfig -n $NS get daemonset -o jsonpath='{.items[0].status.numberReady}')\" = 2 ]"
lab_cmd daemonset kc -n "$NS" get daemonset -o json
lab_cmd plugin-pods kc -n "$NS" get pods -o json
cl_wait 600 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get resourceslices --field-selector spec.nodeName=lab2,spec.driver=$DRIVER -o jsonpath='{.items[*].spec.devices[*].name}' | grep -qw pci-0000-00-18-0"
lab_cmd slices kc get resourceslices -o json

# The shipped DeviceClasses and claim examples, and the claim for what only lab2 has.
template two-amd 'device.attributes["gpupass.dev"].vendorID == "1002" && device.attributes["gpupass.dev"].groupSize == 2'
# (The DeviceClasses are the chart's.)
lab_cmd manifests kc apply -f "$CL/dra/claim-examples.yaml" -f two-amd.yaml

# claim_json POD: the Pod's first claim as JSON.
claim_of() { kc get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}'; }
running() { [ "$(kc get pod "$1" -o jsonpath='{.status.containerStatuses[0].ready}')" = true ]; }

# 1-3 run side by side (the two guests prepare at once; under TCG each Pod takes minutes).
# 1. What only lab2 has: the scheduler places the Pod there, lab2's plugin prepares 00:18.
# 2. lab's own group, pinned to lab (nodeSelector): prepared here, lab2's 00:05 untouched.
cl_claim_pod two-amd two-amd
cl_claim_pod two-vga lab-vga lab
# 3. Once two-amd's claim holds the group lab2 offers, a second Pod asking for it stays Pending,
# and the scheduler says why in its events.
cl_wait 600 sh -c "[ -n \"\$(kubectl --kubeconfig $CL/admin.kubeconfig get resourceclaim \$(kubectl --kubeconfig $CL/admin.kubeconfig get pod two-amd -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}') -o jsonpath='{.status.allocation.devices.results[0].device}')\" ]"
cl_claim_pod two-amd-held two-amd

cl_wait 900 running two-amd
lab_cmd amd-pod kc get pod two-amd -o json
lab_cmd amd-claim kc get resourceclaim "$(claim_of two-amd)" -o json

cl_wait 600 running two-vga
cl_wait 300 said_ready two-vga
lab_cmd vga-pod kc get pod two-vga -o json
lab_cmd vga-claim kc get resourceclaim "$(claim_of two-vga)" -o json
lab_cmd vga-log logs_of two-vga
node_facts vga-held

cl_wait 300 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get events --field-selector involvedObject.name=two-amd-held -o jsonpath='{.items[*].reason}' | grep -qw FailedScheduling"
lab_cmd held-events kc get events --field-selector involvedObject.name=two-amd-held -o json

# lab2 ships its side while both Pods run.
lab_cmd phase-held phase held
# Still Pending after all that (minutes under TCG), on no node.
lab_cmd held-pod kc get pod two-amd-held -o json

# 4. Deleting the Pods unprepares on the right node (the two that run, deleted together).
lab_cmd held-deleted kc delete pod two-amd-held --wait=true --timeout=300s
lab_cmd running-deleted kc delete pod two-amd two-vga --wait=true --timeout=300s
cl_wait 180 sh -c "[ \"\$(basename \$(readlink /sys/bus/pci/devices/0000:00:05.0/driver) 2>/dev/null)\" = bochs-drm ] && [ \"\$(basename \$(readlink /sys/bus/pci/devices/0000:00:05.1/driver) 2>/dev/null)\" = snd_hda_intel ]"
node_facts released
lab_cmd released-recover gpupass recover --dry-run
lab_cmd phase-released phase released
# The claims made from the templates go with their Pods (the resource claim controller).
cl_wait 120 sh -c "[ -z \"\$(kubectl --kubeconfig $CL/admin.kubeconfig get resourceclaims -o name)\" ]"
lab_cmd claims-after kc get resourceclaims -o json

# 5. Binding conditions across nodes (docs/dra.md, "Binding conditions"): lab's 00:05 held
# open by a host process (its DRM node: gpupass's in-use refusal). A Pod that prefers lab and
# whose claim matches the VGA+audio group 00:05 of either node: the scheduler allocates lab's,
# lab's plugin fails the bind before binding (InUse) and taints the device gpupass.dev/busy,
# the scheduler deallocates and chooses again: lab2's group, bound there, and the Pod runs on
# lab2. The holder gone, lab's taint goes.
template two-bochs 'device.attributes["gpupass.dev"].vendorID == "1234" && device.attributes["gpupass.dev"].groupSize == 2'
lab_cmd busy-template kc apply -f two-bochs.yaml
card=$(ls /sys/bus/pci/devices/$VGA/drm | grep '^card' | head -1)
sh -c "exec 7< /dev/dri/$card; exec sleep 1800" &
hpid=$!
sleep 0.5
t=$(cl_t)
# cl_claim_pod's Pod, with a preference for lab (preferred, not required: the scheduler may
# place it on lab2 when lab cannot take it).
CL_POD_AFFINITY="affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 100, preference: {matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [lab]}]}}]}}"
cl_claim_pod two-busy two-bochs
CL_POD_AFFINITY=''
lab_file two-busy.yaml two-busy.yaml
cl_wait 900 running two-busy
lab_facts busy-time "seconds=$(cl_since "$t")" "holder.pid=$hpid" "holder.node=/dev/dri/$card" \
  "holder.alive=$(kill -0 $hpid 2> /dev/null && echo yes || echo no)"
lab_cmd busy-pod kc get pod two-busy -o json
lab_cmd busy-claim kc get resourceclaim "$(claim_of two-busy)" -o json
lab_cmd busy-events kc get events --field-selector involvedObject.name=two-busy -o json
lab_cmd busy-slices kc get resourceslices --field-selector "spec.nodeName=lab,spec.driver=$DRIVER" -o json
node_facts busy
lab_cmd phase-busy phase busy
# The holder goes: lab's device is free, and its busy taint goes at the plugin's next refresh.
kill $hpid
wait $hpid 2> /dev/null
t=$(cl_t)
cl_wait 120 sh -c "! kubectl --kubeconfig $CL/admin.kubeconfig get resourceslices --field-selector spec.nodeName=lab,spec.driver=$DRIVER -o json | grep -q gpupass.dev/busy"
lab_facts freed-time "seconds=$(cl_since "$t")" "holder.alive=$(kill -0 $hpid 2> /dev/null && echo yes || echo no)"
lab_cmd freed-slices kc get resourceslices --field-selector "spec.nodeName=lab,spec.driver=$DRIVER" -o json
lab_cmd busy-deleted kc delete pod two-busy --wait=true --timeout=300s
lab_cmd phase-busy-released phase busy-released
lab_cmd plugin-log-busy plugin_log

# 6. The end: helm uninstall (the DaemonSet's Pods leave both nodes, never unbinding: nothing
# is prepared now), lab2 ships its end (its ack says it has shipped all), then lab.
lab_cmd helm-uninstall helm uninstall $REL --namespace $NS
lab_cmd plugin-stop cl_wait 180 plugin_gone
lab_cmd phase-end phase end
node_facts end
cl_files
cluster_down
