# lab-about: kernel boots, IOMMU groups exist, VFIO/mdev/kvm load (no gpupass needed)
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
# Exercise the file channel: the kernel's own view of the groups.
for g in /sys/kernel/iommu_groups/*; do
  for d in "$g"/devices/*; do echo "$(basename "$g") $(basename "$d")"; done
done > groups.txt
lab_file groups.txt groups.txt
