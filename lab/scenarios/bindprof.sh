# lab-about: profile: strace of the floor's writes and of gpupass bind/unbind (not a test)
# lab-needs: gpupass
# lab-files: /usr/bin/strace
# lab-timeout: 300
VGA=0000:00:05.0
HDA=0000:00:05.1
D=/sys/bus/pci/devices
cat > /tmp/floor.sh <<'EOS'
D=/sys/bus/pci/devices; VGA=0000:00:05.0; HDA=0000:00:05.1
echo vfio-pci > $D/$HDA/driver_override; echo $HDA > /sys/bus/pci/drivers/snd_hda_intel/unbind
echo $HDA > /sys/bus/pci/drivers_probe
echo vfio-pci > $D/$VGA/driver_override; echo $VGA > /sys/bus/pci/drivers/bochs-drm/unbind
echo $VGA > /sys/bus/pci/drivers_probe
echo > $D/$VGA/driver_override; echo $VGA > /sys/bus/pci/drivers/vfio-pci/unbind
echo $VGA > /sys/bus/pci/drivers_probe
echo > $D/$HDA/driver_override; echo $HDA > /sys/bus/pci/drivers/vfio-pci/unbind
echo $HDA > /sys/bus/pci/drivers_probe
EOS
sh /tmp/floor.sh
strace -f -tt -T -o /tmp/floor.trace sh /tmp/floor.sh
grep -E 'write\(1|execve|exit' /tmp/floor.trace
strace -f -tt -T -o /tmp/bind.trace gpupass bind 00:05.0
strace -f -tt -T -o /tmp/unbind.trace gpupass unbind 00:05.0
echo "=== BIND TRACE"; cat /tmp/bind.trace
echo "=== UNBIND TRACE"; cat /tmp/unbind.trace
strace -c -f -o /tmp/c.trace gpupass bind 00:05.0; cat /tmp/c.trace
strace -c -f -o /tmp/c.trace gpupass unbind 00:05.0; cat /tmp/c.trace
lab_pass done "$(readlink $D/$VGA/driver)"
