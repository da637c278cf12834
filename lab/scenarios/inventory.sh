# lab-about: gpupass list/groups/check in the guest, compared on the host with the kernel's own view
# lab-needs: gpupass
# lab-steps: list-all groups check check-json list kernel-view host/devices-match
# lab-steps: host/device-fields host/group-members host/vga-hda-group
# lab-steps: host/list-groups-consistent iommu-width numa-nodes
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

# The host facts the VM outputs check against (docs/vm-outputs.md): the IOMMU's input address
# width from the emulated VT-d unit's capability register (MGAW, bits 21:16, plus one), and the
# NUMA nodes with their CPUs, as the kernel gives them and as gpupass read them.
want=""
for c in /sys/class/iommu/*/intel-iommu/cap; do
  [ -f "$c" ] || continue
  w=$(( ((0x$(cat "$c") >> 16) & 0x3f) + 1 ))
  if [ -z "$want" ] || [ "$w" -lt "$want" ]; then want=$w; fi
done
got=$(sed -n 's/.*"iommu_addr_bits": \([0-9]*\).*/\1/p' list.json | head -1)
lab_expect iommu-width "${want:-none} bits" "${got:-none} bits"
want=""
for n in /sys/devices/system/node/node[0-9]*; do
  [ -d "$n" ] && want="$want $(basename "$n" | sed 's/node//'):$(cat "$n/cpulist")"
done
got=$(tr -d ' \n' < list.json | grep -o '"node":[0-9]*,"cpulist":"[^"]*"' |
  sed 's/"node":\([0-9]*\),"cpulist":"\([^"]*\)"/ \1:\2/' | tr -d '\n')
lab_expect numa-nodes "${want:-none}" "${got:-none}"
