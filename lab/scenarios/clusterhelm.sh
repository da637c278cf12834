# lab-about: the DRA driver deployed as users deploy it (docs/deploy.md): the image deploy/image/build.sh made on the host imported into the node's containerd, the chart deploy/helm/gpupass installed with helm (the plugin a DaemonSet Pod with the chart's ServiceAccount through kube-rs's in-cluster configuration, least privilege checked with kubectl auth can-i), a claim prepared and given back, helm upgrade to a rebuilt image with a claim held (the new Pod takes it over from the checkpoint), helm uninstall with a claim held (the group stays; reinstalled, the Pod's deletion unprepares), and a host gpupass bind racing a Prepare through the shared /run/gpupass lock. The guest runs the commands and ships their output; tests/it/labjudge/clusterhelm.rs judges every step
# lab-needs: gpupass
# lab-carry: cluster
# lab-carry: deploy
# lab-mem: 2048
# lab-smp: 2
# lab-cgroup: v2
# lab-modules: 9pnet_virtio
# lab-modules: 9p
# lab-modules: overlay
# lab-modules: virtio_net
# lab-timeout: 1500
# lab-judge: rust
#
# Judged in Rust (docs/lab.md, "Judged scenarios"): after the cluster's bring-up (the shared
# lab/cluster/guest.sh, whose stages report their own results as in every cluster scenario),
# this script decides nothing. Each command runs under `lab_cmd NAME`, and `state NAME` ships
# what the guest read itself (the group's drivers, the checkpoint's claims, the journal's open
# plans, the plugin Pods) as NAME.facts; tests/it/labjudge/clusterhelm.rs decides each step.
#
# helm runs here, in the guest, with the admin kubeconfig, as an operator runs it from a
# workstation: the scenario's order (a claim held across an upgrade, a bind racing a Prepare)
# is the guest's, and the host has no hook to run commands at a moment the guest chooses.
# shellcheck source=../cluster/guest.sh
. /lab/cluster/lib.sh
cluster_begin

VGA=0000:00:05.0
AUD=0000:00:05.1
DRIVER=vfio.gpupass.dev
PDIR=/var/lib/kubelet/plugins/$DRIVER
NS=gpupass-system
REL=gpupass
D=/opt/deploy
CTR="ctr --address /run/containerd/containerd.sock -n k8s.io"
export HELM_CONFIG_HOME=/tmp/helm/config HELM_CACHE_HOME=/tmp/helm/cache HELM_DATA_HOME=/tmp/helm/data
helm() { "$D/helm" --kubeconfig "$CL/admin.kubeconfig" "$@"; }
drv() { basename "$(readlink "/sys/bus/pci/devices/$1/driver" 2> /dev/null)" 2> /dev/null || echo none; }
plugin_pods() { kc -n "$NS" get pods -l app.kubernetes.io/component=kubelet-plugin -o jsonpath='{range .items[*]}{.metadata.name}{" "}{end}' 2> /dev/null; }
plugin_pod() { plugin_pods | awk '{ print $1 }'; }
claim_uid() { kc get resourceclaim "$(kc get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')" -o jsonpath='{.metadata.uid}' 2> /dev/null; }
# The claims the plugin's checkpoint holds (their UIDs), and the journal's unfinished plans.
ckpt_uids() { grep -o '"uid": *"[^"]*"' "$PDIR/checkpoint.json" 2> /dev/null | sed 's/.*"\([^"]*\)"$/\1/' | tr '\n' ' '; }
open_plans() {
  _o=$(gpupass recover --dry-run 2>&1)
  case $_o in *'nothing to recover'*) echo 0 ;; *) echo "$_o" | grep -c 'unfinished' ;; esac
}

# state NAME [KEY=VALUE...]: what the guest reads itself after a step. With NOLOCK=1 the
# journal is not read (recover takes the lock, which the race's bind holds then).
state() {
  _st=$1; shift
  lab_facts "$_st" "vga.driver=$(drv $VGA)" "aud.driver=$(drv $AUD)" "checkpoint=$(ckpt_uids)" \
    "open=$([ "${NOLOCK:-0}" = 1 ] && echo unread || open_plans)" "plugin.pods=$(plugin_pods)" \
    "reg.sock=$([ -S "/var/lib/kubelet/plugins_registry/$DRIVER-reg.sock" ] && echo present || echo absent)" "$@"
}
# ready_pod POD: the claim Pod's container said READY (cl_claim_pod's probe).
ready_pod() { crictl ps -a --label "io.kubernetes.pod.name=$1" -q | grep -q . && cl_logs "$1" | grep -qx READY; }
# plugin_ready [NOT]: one plugin Pod, other than NOT, Ready, and the kubelet registered it.
plugin_ready() {
  _pr=$(plugin_pod)
  [ -n "$_pr" ] && [ "$_pr" != "${1:-}" ] &&
    [ "$(kc -n "$NS" get pod "$_pr" -o jsonpath='{.status.containerStatuses[0].ready}')" = true ] &&
    cl_logs "$_pr" | grep -q "the kubelet registered $DRIVER"
}
# plugin_facts NAME: the plugin Pod (its spec and status as JSON) and its log, through the CRI.
# (Not _p: lab_file's variable.)
plugin_facts() {
  _pf=$(plugin_pod)
  lab_cmd "$1-pod" kc -n "$NS" get pod "$_pf" -o json
  lab_cmd "$1-log" cl_logs "$_pf"
}
# sample_drivers SECONDS: the group's drivers every 2 s for SECONDS, "vga+aud" words.
sample_drivers() {
  _end=$(($(cut -d. -f1 /proc/uptime) + $1)) _smp=''
  while [ "$(cut -d. -f1 /proc/uptime)" -lt "$_end" ]; do
    _smp="$_smp $(drv $VGA)+$(drv $AUD)"
    sleep 2
  done
  echo "$_smp"
}

state start "group=$(lab_group $VGA)"

# 1. The images deploy/image/build.sh made on the host (lab.sh carry_deploy), over 9p.
mkdir -p $D
lab_cmd mount-deploy mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=524288 deploy $D
lab_cmd images-built cat $D/images.txt
lab_cmd import-1 $CTR images import --platform linux/amd64 $D/gpupass-lab-1.oci.tar
lab_cmd images-1 $CTR images ls

# 2. helm install with the lab's values: the image as imported (never pulled), the API server
# as the node reaches it (no kube-proxy here: the kubernetes Service's ClusterIP does not
# route), the node's network (the lab's one Pod NIC stays for the claim Pods).
cl_lab_values lab-values.yaml
lab_file lab-values.yaml lab-values.yaml
# DeviceClasses an earlier scenario of this boot applied by hand (clusterdra) belong to no
# release; helm refuses to adopt them.
lab_cmd old-classes kc delete deviceclass "$DRIVER" "mdev.$DRIVER" "nvidia-gpu-iommufd.$DRIVER" "vm.$DRIVER" --ignore-not-found
t=$(cl_t)
lab_cmd helm-install helm install $REL $D/chart --namespace $NS --create-namespace -f lab-values.yaml
cl_wait 300 plugin_ready
lab_facts install-time "seconds=$(cl_since "$t")"
cl_wait 120 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get resourceslices --field-selector spec.nodeName=$CL_NODE,spec.driver=$DRIVER -o jsonpath='{.items[*].spec.devices[*].name}' | grep -qw pci-0000-00-05-0"
plugin_facts install
lab_cmd install-slices kc get resourceslices --field-selector "spec.nodeName=$CL_NODE,spec.driver=$DRIVER" -o json
lab_cmd install-classes kc get deviceclasses -o json
SA=$(kc -n "$NS" get pod "$(plugin_pod)" -o jsonpath='{.spec.serviceAccountName}')
# What the service account may do: each question to the API server's authorizer (its answer,
# yes or no, on stdout; stderr has kubectl's warnings on cluster-scoped resources).
cani() {
  while read -r _verb _res _ns _sub; do
    _a=$(kubectl --kubeconfig "$CL/admin.kubeconfig" auth can-i "$_verb" "$_res" --as="system:serviceaccount:$NS:$SA" \
      $([ "$_ns" != - ] && echo "-n $_ns") $([ "$_sub" != - ] && echo "--subresource=$_sub") 2> /dev/null)
    echo "$_verb $_res $_ns $_sub $_a"
  done << EOF
get resourceclaims.resource.k8s.io default -
list resourceslices.resource.k8s.io - -
create resourceslices.resource.k8s.io - -
update resourceslices.resource.k8s.io - -
delete resourceslices.resource.k8s.io - -
get nodes - -
delete pods default -
list secrets $NS -
get secrets kube-system -
create pods default -
update resourceclaims.resource.k8s.io default -
update resourceclaims.resource.k8s.io default status
list resourceclaims.resource.k8s.io default -
watch resourceslices.resource.k8s.io - -
patch nodes - -
update nodes - status
delete deviceclasses.resource.k8s.io - -
create serviceaccounts $NS token
EOF
}
lab_cmd can-i cani
lab_facts sa "name=$SA" "namespace=$NS"

# 3. A claim through the chart's DeviceClass, prepared by the Pod's plugin and given back.
lab_cmd templates kc apply -f "$CL/dra/claim-examples.yaml"
cl_claim_pod helm-a lab-vga
cl_wait 600 ready_pod helm-a
lab_cmd a-log cl_logs helm-a
state a-running "claim=$(claim_uid helm-a)"

# 4. helm upgrade to the rebuilt image while helm-a holds the claim: the old Pod stops (never
# unbinding), the new one reads the checkpoint; the group's drivers are sampled throughout.
lab_cmd import-2 $CTR images import --platform linux/amd64 $D/gpupass-lab-2.oci.tar
lab_cmd images-2 $CTR images ls
old=$(plugin_pod)
t=$(cl_t)
lab_cmd helm-upgrade helm upgrade $REL $D/chart --namespace $NS --reuse-values --set image.tag=lab-2
smp=''
i=0
while [ $i -lt 150 ] && ! plugin_ready "$old"; do
  smp="$smp $(drv $VGA)+$(drv $AUD)"
  sleep 2
  i=$((i + 1))
done
state upgraded "old.pod=$old" "seconds=$(cl_since "$t")" "samples=$smp" "claim=$(claim_uid helm-a)"
plugin_facts upgrade
_c=$(claim_uid helm-a)
lab_cmd a-delete kc delete pod helm-a --wait=true --timeout=300s
cl_wait 120 sh -c "[ \"\$(basename \$(readlink /sys/bus/pci/devices/$VGA/driver)) \$(basename \$(readlink /sys/bus/pci/devices/$AUD/driver))\" = 'bochs-drm snd_hda_intel' ]"
cl_wait 60 sh -c "! grep -q '$_c' $PDIR/checkpoint.json"
state a-deleted "claim=$_c"
lab_cmd upgrade-log-after cl_logs "$(plugin_pod)"
lab_cmd a-recover gpupass recover --dry-run

# 5. helm uninstall while helm-b holds a claim: the plugin goes, the group stays with the
# running Pod; installed again, the Pod's deletion unprepares.
cl_claim_pod helm-b lab-vga
cl_wait 600 ready_pod helm-b
state b-running "claim=$(claim_uid helm-b)"
t=$(cl_t)
lab_cmd helm-uninstall helm uninstall $REL --namespace $NS
cl_wait 120 sh -c "[ -z \"\$(kubectl --kubeconfig $CL/admin.kubeconfig -n $NS get pods -o name)\" ] && [ ! -S /var/lib/kubelet/plugins_registry/$DRIVER-reg.sock ]"
smp=$(sample_drivers 20)
state uninstalled "seconds=$(cl_since "$t")" "samples=$smp" "claim=$(claim_uid helm-b)" \
  "b.container=$(crictl ps --label io.kubernetes.pod.name=helm-b -o json | grep -o '"state": *"[A-Z_]*"' | head -1 | sed 's/.*"\([A-Z_]*\)"$/\1/')" \
  "b.phase=$(kc get pod helm-b -o jsonpath='{.status.phase}')" \
  "classes=$(kc get deviceclasses -o name | grep -c "$DRIVER")" \
  "release=$(helm list -n $NS -q | tr '\n' ' ')"
lab_cmd uninstall-slices kc get resourceslices --field-selector "spec.nodeName=$CL_NODE,spec.driver=$DRIVER" -o json
t=$(cl_t)
lab_cmd helm-reinstall helm install $REL $D/chart --namespace $NS -f lab-values.yaml --set image.tag=lab-2
cl_wait 300 plugin_ready
state reinstalled "seconds=$(cl_since "$t")" "claim=$(claim_uid helm-b)"
_c=$(claim_uid helm-b)
lab_cmd b-delete kc delete pod helm-b --wait=true --timeout=300s
cl_wait 120 sh -c "[ \"\$(basename \$(readlink /sys/bus/pci/devices/$VGA/driver)) \$(basename \$(readlink /sys/bus/pci/devices/$AUD/driver))\" = 'bochs-drm snd_hda_intel' ]"
cl_wait 60 sh -c "! grep -q '$_c' $PDIR/checkpoint.json"
state b-deleted "claim=$_c"
plugin_facts reinstall
lab_cmd b-recover gpupass recover --dry-run

# 6. A host `gpupass bind` of the group racing a claim's Prepare, one lock and one journal
# (/run/gpupass, the chart's hostPath). The bind holds the lock from before its first write
# (the test kit's GPUPASS_PAUSE_BEFORE_APPLY) while the kubelet's Prepare comes: the Prepare
# waits its bounded time and fails naming the holder; nothing is written meanwhile; the bind
# then finishes; the kubelet's retry prepares the claim on the group as the bind left it.
(GPUPASS_PAUSE_BEFORE_APPLY=50 gpupass bind $VGA > race-bind.out 2> race-bind.err < /dev/null; echo $? > race-bind.rc) &
race=$!
cl_wait 30 grep -q 'holding the lock' race-bind.err
t=$(cl_t)
cl_claim_pod helm-race lab-vga
ev() { kc get events --field-selector involvedObject.name=helm-race -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}' 2> /dev/null; }
changing() { ev | grep -q 'is changing devices'; }
pair() { echo "$(drv $VGA)+$(drv $AUD)"; }
smp=$(cl_samples 25 changing pair)
lab_cmd race-events ev
NOLOCK=1
state race-held "samples=$smp" "seconds=$(cl_since "$t")" "bind.running=$(kill -0 $race 2> /dev/null && echo yes || echo no)"
NOLOCK=0
wait $race
for f in race-bind.out race-bind.err race-bind.rc; do lab_file "$f" "$f"; done
state race-bound
cl_wait 600 ready_pod helm-race
lab_cmd race-log cl_logs helm-race
state race-running "claim=$(claim_uid helm-race)"
_c=$(claim_uid helm-race)
lab_cmd race-delete kc delete pod helm-race --wait=true --timeout=300s
cl_wait 60 sh -c "! grep -q '$_c' $PDIR/checkpoint.json"
state race-deleted "claim=$_c"
lab_cmd race-unbind gpupass unbind $VGA
state race-unbound
lab_cmd race-recover gpupass recover --dry-run
lab_cmd race-plugin-log cl_logs "$(plugin_pod)"

# The release removed (a later scenario of the boot may run its own plugin under this name).
lab_cmd helm-end helm uninstall $REL --namespace $NS
cl_wait 120 sh -c "[ -z \"\$(kubectl --kubeconfig $CL/admin.kubeconfig -n $NS get pods -o name)\" ]"
state end
cluster_end
