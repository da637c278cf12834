# lab-about: kernel boots, IOMMU groups exist, VFIO/mdev/kvm load (no gpupass needed)
# lab-steps: kernel dmar iommu-groups module-vfio module-vfio_iommu_type1 module-vfio_pci
# lab-steps: module-mdev module-mbochs module-mdpy module-mtty module-kvm_amd module-bochs
# lab-steps: module-virtio_gpu module-snd_hda_intel dev-vfio dev-kvm kvm-nested vga-driver
# lab-steps: vga-id vga-hda-group virtio-gpu-driver hda-driver mdev-parents bigbar msix-cap
# lab-steps: edu-msi-cap host/groups-file
# lab-steps-6.1: no-iommufd cgroup-v1-devices
# lab-steps-6.12: dev-iommu cgroup-unified cgroup-v1-mounts vfio-cdev vfio-cdev-released
lab_pass kernel "$(uname -r)"
lab_check dmar test -e /sys/class/iommu/dmar0
n=$(ls /sys/kernel/iommu_groups | wc -l)
if [ "$n" -gt 5 ]; then lab_pass iommu-groups "$n groups"; else lab_fail iommu-groups "only $n groups"; fi
for m in vfio vfio_iommu_type1 vfio_pci mdev mbochs mdpy mtty kvm_amd bochs virtio_gpu snd_hda_intel; do
  lab_check "module-$m" test -d "/sys/module/$m"
done
lab_check dev-vfio test -c /dev/vfio/vfio
lab_check dev-kvm test -c /dev/kvm
lab_expect kvm-nested 1 "$(cat /sys/module/kvm_amd/parameters/nested 2>/dev/null)"
lab_expect vga-driver bochs-drm "$(lab_driver 0000:00:02.0)"
lab_expect vga-id "0x1234 0x1111" "$(cat /sys/bus/pci/devices/0000:00:02.0/vendor /sys/bus/pci/devices/0000:00:02.0/device | tr '\n' ' ' | sed 's/ $//')"
g0=$(lab_group 0000:00:05.0); g1=$(lab_group 0000:00:05.1)
if [ -n "$g0" ] && [ "$g0" = "$g1" ]; then lab_pass vga-hda-group "00:05.0 and 00:05.1 in group $g0"
else lab_fail vga-hda-group "00:05.0 group '$g0', 00:05.1 group '$g1'"; fi
lab_expect virtio-gpu-driver virtio-pci "$(lab_driver 0000:00:04.0)"
lab_expect hda-driver snd_hda_intel "$(lab_driver 0000:00:05.1)"
n=$(ls /sys/class/mdev_bus 2>/dev/null | wc -l)
if [ "$n" -ge 3 ]; then lab_pass mdev-parents "$(ls /sys/class/mdev_bus | tr '\n' ' ')"; else lab_fail mdev-parents "$n parents"; fi
# ---- the leg: 6.12 has iommufd + the VFIO cdev and only cgroup v2; 6.1 neither, cgroup v1
# The filesystem type of /sys/fs/cgroup by its magic (busybox stat names no cgroup2fs):
# 0x63677270 is CGROUP2_SUPER_MAGIC.
fs=$(stat -f -c %t /sys/fs/cgroup 2>/dev/null)
if [ "$LAB_KERNEL" = 6.12 ]; then
  lab_check dev-iommu test -c /dev/iommu
  lab_expect cgroup-unified 63677270 "$fs"
  lab_expect cgroup-v1-mounts 0 "$(awk '$3 == "cgroup"' /proc/mounts | wc -l)"
  # A device bound to vfio-pci gets its cdev: /dev/vfio/devices/vfioN.
  D=0000:00:07.0
  echo vfio-pci > /sys/bus/pci/devices/$D/driver_override
  echo $D > /sys/bus/pci/drivers_probe
  cdev=$(ls /sys/bus/pci/devices/$D/vfio-dev 2>/dev/null)
  if [ -n "$cdev" ] && [ -c "/dev/vfio/devices/$cdev" ]; then
    lab_pass vfio-cdev "$D -> /dev/vfio/devices/$cdev ($(cat /sys/bus/pci/devices/$D/vfio-dev/$cdev/dev))"
  else
    lab_fail vfio-cdev "$D on '$(lab_driver $D)': no vfio-dev/ or no /dev/vfio/devices node"
  fi
  echo $D > /sys/bus/pci/drivers/vfio-pci/unbind
  echo > /sys/bus/pci/devices/$D/driver_override
  lab_expect vfio-cdev-released "" "$(lab_driver $D)"
else
  # 6.1 facts, not failures: Debian's 6.1 has no iommufd and no VFIO cdev.
  if [ -e /dev/iommu ]; then lab_fail no-iommufd "/dev/iommu exists on 6.1"; else lab_pass no-iommufd "6.1: no /dev/iommu (Debian's 6.1 is built without CONFIG_IOMMUFD)"; fi
  lab_expect cgroup-v1-devices cgroup "$(awk '$2 == "/sys/fs/cgroup/devices" {print $3}' /proc/mounts)"
fi
# ---- the GPU-like devices of both legs
# ivshmem-plain 00:0c.0: BAR2 16 GiB, 64-bit prefetchable, placed above 4 GiB.
set -- $(sed -n 3p /sys/bus/pci/devices/0000:00:0c.0/resource)
if [ $# = 3 ] && [ $(( $2 - $1 + 1 )) = $((16 << 30)) ] && [ $(( $1 >= (1 << 32) )) = 1 ] && [ $(( $3 & 0x2000 )) != 0 ]; then
  lab_pass bigbar "00:0c.0 BAR2 $1-$2 (16 GiB, 64-bit prefetchable, above 4 GiB)"
else
  lab_fail bigbar "00:0c.0 BAR2 resource line: '$*'"
fi
# e1000e 00:0d.0: MSI-X (cap 0x11) and MSI (0x05) in its capability list.
caps=$(lab_caps 0000:00:0d.0)
case " $caps " in
  *" 0x11 "*) lab_pass msix-cap "00:0d.0 capabilities: $caps" ;;
  *) lab_fail msix-cap "00:0d.0 capabilities: '$caps'" ;;
esac
caps=$(lab_caps 0000:00:06.0)
case " $caps " in
  *" 0x05 "*) lab_pass edu-msi-cap "00:06.0 capabilities: $caps" ;;
  *) lab_fail edu-msi-cap "00:06.0 capabilities: '$caps'" ;;
esac
# Exercise the file channel: the kernel's own view of the groups.
for g in /sys/kernel/iommu_groups/*; do
  for d in "$g"/devices/*; do echo "$(basename "$g") $(basename "$d")"; done
done > groups.txt
lab_file groups.txt groups.txt
