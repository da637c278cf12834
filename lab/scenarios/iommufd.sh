# lab-about: gpupass boot through iommufd (the VFIO device cdev + /dev/iommu) and through the legacy group + container on the same 6.12 kernel; an mbochs mdev through its cdev; on 6.1 iommufd is refused naming the kernel requirement
# lab-needs: gpupass
# lab-timeout: 300
# lab-steps: dev-kvm bind bind-driver auto-backend unbind restored
# lab-steps-6.12: cdev-node iommufd-rc iommufd-backend iommufd-nodes iommufd-dev iommufd-dispi
# lab-steps-6.12: iommufd-loop-exits iommufd-kvm-mmio iommufd-dma legacy-rc legacy-backend legacy-dispi
# lab-steps-6.12: legacy-loop-exits legacy-kvm-mmio mdev-create mdev-cdev mdev-iommufd mdev-iommufd-dispi
# lab-steps-6.12: mdev-legacy-under-auto mdev-removed cdev-released
# lab-steps-6.1: iommufd-refused
#
# The device is the bochs-display 00:03.0 (BAR2, 4 KiB, mmappable: a KVM slot); the VMM reads
# its dispi ID register through BAR2 in a 100k-read loop whose exits KVM counts. Binding is
# `gpupass bind`/`unbind` only.

T=120
LOOP=100000
D=0000:00:03.0
U=3c1e9a7b-2d4f-4a6e-8b5c-7d9e0f1a2b3c

json_get() { grep -m1 "\"$2\":" "$1" | sed 's/.*: *//; s/,$//; s/^"//; s/"$//'; }
loop_exits() { sed -n '/"read_loop": {/,/"timing"/p' "$1" | grep -m1 '"total":' | sed 's/.*: *//; s/,$//'; }
# kvm_loop FILE NAME: KVM's own counter NAME over the read loop (KVM_GET_STATS_FD)
kvm_loop() { sed -n '/"read_loop": {/,/"timing"/p' "$1" | grep -m1 "\"$2\":" | sed 's/.*: *//; s/,$//'; }
# boot_json NAME ARGS...: gpupass boot --json ... > NAME.json; sets RC
boot_json() {
  _n=$1; shift
  echo "\$ gpupass boot $* --timeout $T --json"
  gpupass boot "$@" --timeout $T --json > "$_n.json" 2> "$_n.err"
  RC=$?
  cat "$_n.err"
  lab_file "$_n.json" "$_n.json"
  [ -s "$_n.err" ] && lab_file "$_n.err" "$_n.err"
}

lab_check dev-kvm test -c /dev/kvm
orig=$(lab_driver $D)
lab_run bind bind.txt gpupass bind $D
lab_expect bind-driver vfio-pci "$(lab_driver $D)"

if [ "$LAB_KERNEL" = 6.12 ]; then
  # ---- 1. the function's cdev: /sys/.../vfio-dev/vfioN and its node
  cdev=$(ls /sys/bus/pci/devices/$D/vfio-dev 2>/dev/null | head -1)
  if [ -n "$cdev" ] && [ -c "/dev/vfio/devices/$cdev" ]; then
    lab_pass cdev-node "/dev/vfio/devices/$cdev ($(cat /sys/bus/pci/devices/$D/vfio-dev/$cdev/dev))"
  else
    lab_fail cdev-node "no cdev for $D: '$cdev' $(ls -l /dev/vfio/devices 2>&1 | tr '\n' ' ')"
  fi

  # ---- 2. iommufd: the cdev bound to an iommufd, attached to an IOAS, guest RAM mapped
  boot_json iommufd --device $D --backend iommufd --read-loop $LOOP --read-bar 2
  lab_expect iommufd-rc 0 "$RC"
  lab_expect iommufd-backend iommufd "$(json_get iommufd.json backend)"
  if grep -q "\"/dev/vfio/devices/$cdev\"" iommufd.json && grep -q '"/dev/iommu"' iommufd.json; then
    lab_pass iommufd-nodes "/dev/vfio/devices/$cdev + /dev/iommu"
  else
    lab_fail iommufd-nodes "$(sed -n '/"vfio_nodes"/,/]/p' iommufd.json | tr -d ' \n')"
  fi
  lab_expect iommufd-dev 1 "$(grep -c '"FW dev 00:01.0 1234:1111' iommufd.json)"
  lab_expect iommufd-dispi 1 "$(grep -c '"FW dispi 00:01.0 0xb0c5"' iommufd.json)"
  lab_expect iommufd-loop-exits 0 "$(loop_exits iommufd.json)"
  # KVM's own count: no MMIO exit in the 100k reads of the mapped BAR
  lab_expect iommufd-kvm-mmio 0 "$(kvm_loop iommufd.json mmio_exits)"
  dma=$(json_get iommufd.json dma_mapped)
  if [ "${dma:-0}" -gt 0 ]; then lab_pass iommufd-dma "dma_mapped=$dma bytes of guest RAM in the IOAS"; else lab_fail iommufd-dma "dma_mapped=$dma"; fi

  # ---- 3. legacy on the same kernel (VFIO_CONTAINER is built in beside iommufd)
  boot_json legacy --device $D --backend legacy --read-loop $LOOP --read-bar 2
  lab_expect legacy-rc 0 "$RC"
  lab_expect legacy-backend legacy "$(json_get legacy.json backend)"
  lab_expect legacy-dispi 1 "$(grep -c '"FW dispi 00:01.0 0xb0c5"' legacy.json)"
  lab_expect legacy-loop-exits 0 "$(loop_exits legacy.json)"
  lab_expect legacy-kvm-mmio 0 "$(kvm_loop legacy.json mmio_exits)"

  # ---- 4. auto picks iommufd where the kernel serves the function through it
  boot_json auto --device $D
  lab_expect auto-backend "0 iommufd" "$RC $(json_get auto.json backend)"

  # ---- 5. an mbochs mdev through its cdev: what the kernel does
  t=$(ls -d /sys/class/mdev_bus/*/mdev_supported_types/mbochs-small 2>/dev/null | head -1)
  if [ -n "$t" ] && echo $U > "$t/create"; then lab_pass mdev-create "$U"; else lab_fail mdev-create "no mbochs-small type"; fi
  mcdev=$(ls /sys/bus/mdev/devices/$U/vfio-dev 2>/dev/null | head -1)
  if [ -n "$mcdev" ] && [ -c "/dev/vfio/devices/$mcdev" ]; then
    lab_pass mdev-cdev "mdev $U has /dev/vfio/devices/$mcdev ($(cat /sys/bus/mdev/devices/$U/vfio-dev/$mcdev/dev))"
  else
    lab_fail mdev-cdev "mdev $U: no vfio-dev/vfioN"
  fi
  boot_json mdev-iommufd --mdev $U --backend iommufd
  lab_expect mdev-iommufd "0 iommufd" "$RC $(json_get mdev-iommufd.json backend)"
  lab_expect mdev-iommufd-dispi 1 "$(grep -c '"FW dispi 00:01.0 0xb0c5"' mdev-iommufd.json)"
  boot_json mdev-auto --mdev $U
  lab_expect mdev-legacy-under-auto "0 legacy" "$RC $(json_get mdev-auto.json backend)"
  echo 1 > /sys/bus/mdev/devices/$U/remove
  lab_check mdev-removed test ! -e /sys/bus/mdev/devices/$U
else
  # ---- 6.1: no VFIO cdev; iommufd is refused before anything is opened, auto is legacy
  gpupass boot --device $D --backend iommufd --timeout $T > refused.txt 2> refused.err
  rc=$?
  if [ $rc = 1 ] && grep -q "cannot use iommufd" refused.err && grep -q "predates the VFIO device cdev" refused.err; then
    lab_pass iommufd-refused "$(cat refused.err)"
  else
    lab_fail iommufd-refused "rc=$rc $(tr '\n' ' ' < refused.err)"
  fi
  boot_json auto --device $D
  lab_expect auto-backend "0 legacy" "$RC $(json_get auto.json backend)"
fi

lab_run unbind unbind.txt gpupass unbind $D
lab_expect restored "$orig" "$(lab_driver $D)"
if [ "$LAB_KERNEL" = 6.12 ]; then
  lab_check cdev-released test ! -e "/sys/bus/pci/devices/$D/vfio-dev"
fi
