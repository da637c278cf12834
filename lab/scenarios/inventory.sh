# lab-about: gpupass list/groups/check in the guest, compared on the host with the kernel's own view
# lab-needs: gpupass
# lab-steps: list-all groups check check-json list kernel-view host/devices-match
# lab-steps: host/device-fields host/group-members host/vga-hda-group
# lab-steps: host/list-groups-consistent
lab_run list-all list.json gpupass list --all --json
lab_run groups groups.json gpupass groups --json
lab_run check check.txt gpupass check
lab_run check-json check.json gpupass check --json
lab_run list list.txt gpupass list

# What the kernel itself says, one fact per line, for the host to compare:
#   device BDF GROUP|- DRIVER|- VENDOR DEVICE CLASS
#   member GROUP BDF
for d in /sys/bus/pci/devices/*; do
  b=$(basename "$d")
  g=$(lab_group "$b"); dr=$(lab_driver "$b")
  echo "device $b ${g:--} ${dr:--} $(cat "$d/vendor") $(cat "$d/device") $(cat "$d/class")"
done > kernel.txt
for g in /sys/kernel/iommu_groups/*; do
  for m in "$g"/devices/*; do echo "member $(basename "$g") $(basename "$m")"; done
done >> kernel.txt
lab_file kernel.txt kernel.txt
lab_pass kernel-view "$(grep -c '^device' kernel.txt) devices, $(ls /sys/kernel/iommu_groups | wc -l) groups"
