# lab-about: `gpupass oci-hook` under the real engine (docs/cluster.md): containerd 2.x runs runc 1.5 with the hook as the createRuntime hook of the "gpupass" runtime handler (RuntimeClass gpupass), the Pod's gpupass.dev/devices annotation passed into the OCI spec; on cgroup v2 the requested group's nodes open in the container, a node it did not ask for stays EPERM, and a request the hook refuses stops the container with the hook's reason
# lab-needs: gpupass
# lab-carry: cluster
# lab-mem: 2048
# lab-smp: 2
# lab-modules: overlay
# lab-modules: virtio_net
# lab-timeout: 300
# lab-steps: leg bind runtimeclass hook-pod-succeeded hook-runc hook-nodes hook-not-requested
# lab-steps: hook-cgroup-v2 refused-pod refused-reason unbind teardown
#
# Run alone (lab/lab.sh --kernel 6.12 run clusterhook) or after the other cluster scenarios in
# the same boot (the cluster stays up between them).
# shellcheck source=../cluster/guest.sh
. /lab/cluster/lib.sh
cluster_begin

D=0000:00:07.0
lab_check bind gpupass bind $D
g=$(lab_group $D)
# A node the Pod does not ask for: /dev/iommu's numbers, made with mknod inside the container
# (CAP_MKNOD is in the default set); only the device filter decides whether it opens.
n=$(stat -c '%t %T' /dev/iommu)
umaj=$((0x${n% *})) umin=$((0x${n#* }))

cat > rc.yaml << YAML
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: gpupass}
handler: gpupass
YAML
lab_check runtimeclass kc apply -f rc.yaml

# hookpod NAME DEVICES: a Pod of RuntimeClass gpupass whose annotation asks for DEVICES.
hookpod() {
  cat > "$1.yaml" << YAML
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: default
  annotations: {gpupass.dev/devices: "$2", gpupass.dev/backend: legacy}
spec:
  runtimeClassName: gpupass
  restartPolicy: Never
  automountServiceAccountToken: false
  dnsPolicy: Default
  containers:
  - name: probe
    image: $(cat "$CL/busybox-image")
    imagePullPolicy: Never
    command:
    - /bin/sh
    - -c
    - |
      for p in /dev/vfio/*; do
        [ -c "\$p" ] || continue
        if (exec 3<>"\$p") 2>/dev/null; then echo "node: OK \$p"; else echo "node: \$( (exec 3<>"\$p") 2>&1) \$p"; fi
      done
      mknod /tmp/unasked c $umaj $umin
      if (exec 3<>/tmp/unasked) 2>/dev/null; then echo "unasked: OK"; else echo "unasked: \$( (exec 3<>/tmp/unasked) 2>&1)"; fi
      echo "cgroup: \$(cat /proc/self/cgroup)"
YAML
  kc apply -f "$1.yaml" > /dev/null
}

t=$(cl_t)
hookpod hook "$D"
if cl_wait 600 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get pod hook -o jsonpath='{.status.phase}' | grep -qx Succeeded"; then
  lab_pass hook-pod-succeeded "after $(cl_since "$t") s"
else
  lab_fail hook-pod-succeeded "phase $(kc get pod hook -o jsonpath='{.status.phase} {.status.containerStatuses}' 2>&1 | tail -1)"
fi
cl_logs hook > "$CL_LOG/hook.txt"
cat "$CL_LOG/hook.txt"
lab_file hook.txt "$CL_LOG/hook.txt"
# The runtime that ran it: the build's runc 1.5, named by the handler's options.
lab_expect hook-runc "runc version 1.5.3" "$(runc --version | head -1)"
if grep -qx "node: OK /dev/vfio/$g" "$CL_LOG/hook.txt" && grep -qx "node: OK /dev/vfio/vfio" "$CL_LOG/hook.txt" &&
  ! grep '^node: ' "$CL_LOG/hook.txt" | grep -qv '^node: OK'; then
  lab_pass hook-nodes "$(grep '^node: ' "$CL_LOG/hook.txt" | tr '\n' '|')"
else
  lab_fail hook-nodes "$(grep '^node: ' "$CL_LOG/hook.txt" | tr '\n' '|')"
fi
case $(grep '^unasked: ' "$CL_LOG/hook.txt") in
  *"not permitted"*) lab_pass hook-not-requested "$(grep '^unasked: ' "$CL_LOG/hook.txt") (/dev/iommu's $umaj:$umin, not asked for)" ;;
  *) lab_fail hook-not-requested "want EPERM: $(grep '^unasked: ' "$CL_LOG/hook.txt")" ;;
esac
# The container's cgroup is on the unified hierarchy, no devices controller anywhere: only the
# BPF program the hook extended can have let the nodes open. (containerd gives the container a
# cgroup namespace of its own on v2, so from inside its cgroup reads "0::/".)
if grep -qx 'cgroup: 0::/' "$CL_LOG/hook.txt" && ! grep -q ':devices:' "$CL_LOG/hook.txt" &&
  [ ! -e /sys/fs/cgroup/devices ] && [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  lab_pass hook-cgroup-v2 "$(grep '^cgroup: ' "$CL_LOG/hook.txt")"
else
  lab_fail hook-cgroup-v2 "$(grep '^cgroup: ' "$CL_LOG/hook.txt")"
fi
kc delete pod hook --wait=true --timeout=180s > /dev/null 2>&1

# A request the hook refuses (a function not on vfio-pci): the container never starts, and
# the Pod's status or events carry the hook's own reason.
t=$(cl_t)
hookpod refused 0000:00:02.0
if cl_wait 300 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get pod refused -o jsonpath='{.status.containerStatuses[0].state}' | grep -q -E 'terminated|waiting'" &&
  ! kc get pod refused -o jsonpath='{.status.phase}' | grep -qx Succeeded; then
  lab_pass refused-pod "not run: $(kc get pod refused -o jsonpath='{.status.phase}') after $(cl_since "$t") s"
else
  lab_fail refused-pod "$(kc get pod refused -o jsonpath='{.status.phase} {.status.containerStatuses}' 2>&1 | tail -1)"
fi
sleep 5
{
  kc get pod refused -o jsonpath='{.status.containerStatuses[0].state}'
  echo
  kc get events --field-selector involvedObject.name=refused -o jsonpath='{range .items[*]}{.message}{"\n"}{end}'
} > "$CL_LOG/refused.txt" 2>&1
lab_file refused.txt "$CL_LOG/refused.txt"
if grep -q 'not to vfio-pci' "$CL_LOG/refused.txt"; then
  lab_pass refused-reason "$(grep -o '[^"]*not to vfio-pci[^"]*' "$CL_LOG/refused.txt" | head -1 | cut -c1-200)"
else
  lab_fail refused-reason "$(tr '\n' ' ' < "$CL_LOG/refused.txt" | cut -c1-300)"
fi
kc delete pod refused --wait=true --timeout=180s > /dev/null 2>&1

lab_check unbind gpupass unbind $D
cluster_end
