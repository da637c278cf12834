# lab-about: a one-node Kubernetes built from the official modules (docs/cluster.md): etcd, kube-apiserver, kube-controller-manager, kube-scheduler on the host's loopback (lab/cluster/host.sh), the kubelet + containerd 2.x + runc 1.5 + the reference CNI plugins (host-device, host-local, loopback) in the 6.12 guest, joined over QEMU's user network; the node goes Ready by itself and the scheduler places a busybox Pod whose line the scenario reads back
# lab-carry: cluster
# lab-mem: 2048
# lab-smp: 2
# lab-cgroup: v2
# lab-modules: 9pnet_virtio
# lab-modules: 9p
# lab-modules: overlay
# lab-modules: virtio_net
# lab-timeout: 900
# lab-steps: leg mount-bin versions node-network containerd images-imported control-plane
# lab-steps: kubelet node-registered node-ready no-taints
# lab-steps: default-serviceaccount pod-created pod-scheduled pod-succeeded pod-output pod-ip
# lab-steps: pod-deleted teardown
#
# One command: lab/lab.sh --kernel 6.12 run cluster. The control plane runs on the host
# (lab/cluster/host.sh, loopback only, started by lab.sh before the boot and stopped after it;
# cluster.check reports that); the node half runs here (lab/cluster/guest.sh). lab/cluster/prep.sh
# made this boot's CA, certificates and image archives on the host.
# shellcheck source=../cluster/guest.sh
. /lab/cluster/lib.sh
cluster_begin

# No taint was lifted by hand: whatever the node carries now is the cluster's own doing, and
# a Ready node carries none of the not-ready/unreachable ones.
taints=$(kc get node "$CL_NODE" -o jsonpath='{.spec.taints[*].key}' 2>&1)
if [ -z "$taints" ]; then
  lab_pass no-taints "the node carries no taint"
else
  lab_fail no-taints "taints: $taints"
fi

# The pod needs the namespace's default ServiceAccount, which the controller manager makes.
t=$(cl_t)
cl_ready default-serviceaccount kube-controller-manager "$t" 600 kc get serviceaccount default

# A Pod with no node named: the scheduler places it, the kubelet runs it through containerd
# and runc, its eth0 the NIC the CNI host-device plugin moved in. It prints one line and its
# address; restartPolicy Never, so it ends Succeeded.
img=$(cat "$CL/busybox-image")
cat > hello.yaml << EOF
apiVersion: v1
kind: Pod
metadata:
  name: hello
  namespace: default
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  dnsPolicy: Default
  containers:
  - name: hello
    image: $img
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "echo gpupass-cluster-lab: hello from \$(hostname) uid \$(id -u); ip -4 -o addr show eth0"]
EOF
t=$(cl_t)
lab_check pod-created kc apply -f hello.yaml
if cl_wait 600 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get pod hello -o jsonpath='{.spec.nodeName}' | grep -qx $CL_NODE"; then
  lab_pass pod-scheduled "on $CL_NODE after $(cl_since "$t") s"
else
  lab_fail pod-scheduled "$(kc get pod hello -o jsonpath='{.status.conditions}' 2>&1 | tail -1)"
fi
if cl_wait 600 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get pod hello -o jsonpath='{.status.phase}' | grep -qx Succeeded"; then
  lab_pass pod-succeeded "Succeeded after $(cl_since "$t") s"
  echo "pod $(cl_since "$t")" >> "$CL_LOG/timings.txt"
else
  lab_fail pod-succeeded "phase $(kc get pod hello -o jsonpath='{.status.phase} {.status.containerStatuses}' 2>&1 | tail -1)"
fi
kc get pod hello -o yaml > "$CL_LOG/pod.yaml" 2>&1
kc get events -A > "$CL_LOG/events.txt" 2>&1
cl_logs hello > "$CL_LOG/pod-logs.txt"
cat "$CL_LOG/pod-logs.txt"
if grep -qx "gpupass-cluster-lab: hello from hello uid 0" "$CL_LOG/pod-logs.txt"; then
  lab_pass pod-output "$(grep -x 'gpupass-cluster-lab: hello from hello uid 0' "$CL_LOG/pod-logs.txt")"
else
  lab_fail pod-output "crictl logs: $(head -1 "$CL_LOG/pod-logs.txt")"
fi
# eth0 in the pod got its address from host-local in the pod subnet, and the API has it.
podip=$(kc get pod hello -o jsonpath='{.status.podIP}' 2>&1)
case $podip in
  10.88.1.*)
    if grep -q "inet $podip/24" "$CL_LOG/pod-logs.txt"; then
      lab_pass pod-ip "status.podIP $podip = the pod's eth0"
    else
      lab_fail pod-ip "status.podIP $podip, eth0 in the pod: $(grep inet "$CL_LOG/pod-logs.txt")"
    fi
    ;;
  *) lab_fail pod-ip "status.podIP '$podip' is not in $CL_SUBNET" ;;
esac
if kc delete pod hello --wait=true --timeout=180s > "$CL_LOG/delete.txt" 2>&1; then
  lab_pass pod-deleted "in $(cl_since "$t") s since created"
else
  lab_fail pod-deleted "$(tail -1 "$CL_LOG/delete.txt")"
fi
for f in pod.yaml events.txt node.yaml; do
  [ -f "$CL_LOG/$f" ] && lab_file "$f" "$CL_LOG/$f"
done

cluster_end
