# lab-about: a VM in a Pod (KubeVirt's virt-launcher path) on the real kubelet of the cluster lab: a claim of class vm.vfio.gpupass.dev for the bochs-display 00:03.0 is allocated by the scheduler and prepared by `gpupass dra-plugin`; the unprivileged container gets the group's VFIO nodes and the node's /dev/kvm from the claim's CDI edits, and `gpupass boot --dra-metadata` reads the claim's KEP-5304 metadata file and boots its firmware in a nested-KVM VM on the device (ids and dispi read through VFIO), on the legacy and the iommufd backend (6.1, without iommufd: the claim that requires it is refused before the Pod is bound, the function untouched); deleting the Pod gives the group back
# lab-needs: gpupass
# lab-carry: cluster
# lab-cgroup: v2
# lab-mem: 2048
# lab-smp: 2
# lab-modules: 9pnet_virtio
# lab-modules: 9p
# lab-modules: overlay
# lab-modules: virtio_net
# lab-timeout: 900
# lab-judge: rust
#
# Judged in Rust (tests/it/labjudge/clustervm.rs): this script decides nothing. It runs the
# commands (lab_cmd) and ships what it read itself (lab_facts); the judge decides every step.
# Both kernel legs: on 6.12 the VM boots on each backend; 6.1 has no iommufd, so there the
# claim that requires it is refused at the device's binding conditions, before the Pod is bound
# to the node: the Pod stays Pending with gpupass's reason in its events and the function never
# leaves its driver (the judge reads the leg from leg.facts). Run alone (lab/lab.sh --kernel
# 6.12 run cluster clustervm) or after the other cluster scenarios in the same boot (the plugin
# of clusterdra is stopped by then).
# shellcheck source=../cluster/guest.sh
. /lab/cluster/lib.sh

VGA=0000:00:03.0
DRIVER=vfio.gpupass.dev
PDIR=/var/lib/kubelet/plugins/$DRIVER
drv() { basename "$(readlink "/sys/bus/pci/devices/$1/driver" 2> /dev/null)" 2> /dev/null || echo none; }

# The cluster lab's frame (guest.sh: cluster_up, cluster_down) reports its own stages with
# lab_pass/lab_fail; here they become facts the judge reads (frame.facts, shipped at the end).
: > frame.facts
lab_pass() { echo "$1=PASS $2" >> frame.facts; }
lab_fail() { echo "$1=FAIL $2" >> frame.facts; }
echo "cgroup=$LAB_CGROUP" >> frame.facts
if [ "$LAB_CGROUP" = v2 ] && cluster_up; then echo "up=yes" >> frame.facts; else echo "up=no" >> frame.facts; fi
lab_facts leg "leg=$LAB_KERNEL" "kernel=$(uname -r)"
lab_facts start kernel="$(uname -r)" vga.driver="$(drv $VGA)" vga.group="$(lab_group $VGA)" \
  dev.kvm="$([ -c /dev/kvm ] && echo char || echo absent)"

t=$(cl_t)
cl_start vm-plugin gpupass dra-plugin -v --node "$CL_NODE" --kubeconfig "$CL/admin.kubeconfig"
cl_wait 180 grep -q "the kubelet registered $DRIVER" "$CL_LOG/vm-plugin.log"
lab_facts plugin registered="$(grep -c "the kubelet registered $DRIVER" "$CL_LOG/vm-plugin.log")" \
  seconds="$(cl_since "$t")" last="$(tail -1 "$CL_LOG/vm-plugin.log" | cut -c1-300)"
lab_cmd classes kc apply -f "$CL/dra/deviceclass.yaml"
# The scheduler allocates from the plugin's slices only once they are published.
cl_wait 180 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get resourceslices --field-selector spec.nodeName=$CL_NODE,spec.driver=$DRIVER -o jsonpath='{.items[*].spec.devices[*].name}' | grep -qw pci-0000-00-03-0"

# vm_pod B POLICY: the claim template (class vm.vfio.gpupass.dev: the group plus /dev/kvm; the
# claim's own config sets the backend) and the Pod: an unprivileged container whose only tool is
# the static gpupass (a hostPath file), which lists what it was given and then boots the VM.
vm_pod() {
  cl_template "vm-$1" "vm.$DRIVER" "device.attributes[\"resource.kubernetes.io\"].pciBusID == \"$VGA\"" "$2"
  cat >> "vm-$1.yaml" << EOF
---
apiVersion: v1
kind: Pod
metadata: {name: vm-$1, namespace: default}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  dnsPolicy: Default
  terminationGracePeriodSeconds: 5
  resourceClaims:
  - name: vfio
    resourceClaimTemplateName: vm-$1
  volumes:
  - name: gpupass
    hostPath: {path: /bin/gpupass, type: File}
  containers:
  - name: vm
    image: $(cat "$CL/busybox-image")
    imagePullPolicy: Never
    securityContext: {privileged: false, allowPrivilegeEscalation: false}
    resources:
      claims: [{name: vfio}]
    volumeMounts:
    - {name: gpupass, mountPath: /opt/gpupass/gpupass, readOnly: true}
    command:
    - /bin/sh
    - -c
    - |
      for p in /dev/* /dev/vfio/* /dev/vfio/devices/*; do [ -c "\$p" ] && echo "DEVNODE \$p"; done
      echo "DRIVER \$(basename "\$(readlink /sys/bus/pci/devices/$VGA/driver)")"
      echo "CDEV \$(ls /sys/bus/pci/devices/$VGA/vfio-dev 2>/dev/null)"
      exec /opt/gpupass/gpupass boot --dra-metadata --memory 4M --timeout 120
EOF
}

for b in legacy iommufd; do
  case $b in legacy) policy=legacy ;; *) policy=require-iommufd ;; esac
  vm_pod $b $policy
  t=$(cl_t)
  lab_cmd "$b-apply" kc apply -f "vm-$b.yaml"
  cl_wait 300 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get pod vm-$b -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}' | grep -q ."
  claim=$(kc get pod "vm-$b" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
  if [ "$b" = iommufd ] && [ "$LAB_KERNEL" = 6.1 ]; then
    # No iommufd on this kernel: the plugin refuses the claim at the device's binding
    # conditions (before the scheduler binds the Pod). The function's driver is sampled every
    # 2 s until an event names require-iommufd, then 10 s more.
    refused() { kc get events --field-selector "involvedObject.name=vm-$b" -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' | grep -q 'require-iommufd'; }
    seen=$(cl_samples 150 refused drv $VGA)
    lab_facts "$b-refused" seconds="$(cl_since "$t")"
    seen="$seen $(cl_samples 5 false drv $VGA)"
    lab_facts "$b-untouched" samples="$seen" host.driver="$(drv $VGA)"
    lab_cmd "$b-claim" kc get resourceclaim "$claim" -o json
    lab_cmd "$b-checkpoint" cat "$PDIR/checkpoint.json"
    lab_cmd "$b-recover" gpupass recover --dry-run
    lab_cmd "$b-pod" kc get pod "vm-$b" -o json
  else
    cl_wait 300 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get resourceclaim $claim -o jsonpath='{.status.allocation.devices.results[*].device}' | grep -q ."
    lab_cmd "$b-claim" kc get resourceclaim "$claim" -o json
    cl_wait 600 sh -c "kubectl --kubeconfig $CL/admin.kubeconfig get pod vm-$b -o jsonpath='{.status.phase}' | grep -qE '^(Succeeded|Failed)$'"
    lab_facts "$b-ran" seconds="$(cl_since "$t")" host.driver="$(drv $VGA)"
    lab_cmd "$b-pod" kc get pod "vm-$b" -o json
    lab_cmd "$b-log" cl_logs "vm-$b"
  fi
  lab_cmd "$b-events" kc get events --field-selector "involvedObject.name=vm-$b" -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}'
  t=$(cl_t)
  lab_cmd "$b-delete" kc delete pod "vm-$b" --wait=true --timeout=300s
  cl_wait 300 sh -c "[ \"\$(basename \$(readlink /sys/bus/pci/devices/$VGA/driver) 2>/dev/null)\" != vfio-pci ]"
  cl_wait 120 sh -c "! kubectl --kubeconfig $CL/admin.kubeconfig get resourceclaim $claim"
  lab_facts "$b-after" seconds="$(cl_since "$t")" vga.driver="$(drv $VGA)" \
    claim.gone="$(kc get resourceclaim "$claim" > /dev/null 2>&1 && echo no || echo yes)"
done

cl_wait 60 sh -c "! grep -q '\"uid\"' $PDIR/checkpoint.json 2>/dev/null"
lab_facts end checkpoint.uids="$(grep -c '"uid"' "$PDIR/checkpoint.json" 2> /dev/null)" vga.driver="$(drv $VGA)"
lab_cmd recover gpupass recover --dry-run
t=$(cl_t)
_p=$(cat "$CL_RUN/vm-plugin.pid")
kill "$_p"
cl_wait 30 sh -c "! kill -0 $_p"
lab_facts plugin-stop stopped="$(kill -0 "$_p" 2> /dev/null && echo no || echo yes)" seconds="$(cl_since "$t")"

cl_files
if cluster_last; then cluster_down; else echo "teardown=PASS left up for the next cluster scenario" >> frame.facts; fi
lab_file frame.facts frame.facts
