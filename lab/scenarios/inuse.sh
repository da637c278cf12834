# lab-about: bind refuses functions the host uses, on the real kernel: a mounted filesystem on a virtio-blk disk, an up virtio-net interface
# lab-needs: gpupass
# lab-modules: virtio_net
# lab-modules: virtio_blk
# lab-modules: vfat
# lab-modules: nls_cp437
# lab-modules: nls_ascii
# lab-qemu: -netdev user,id=lab-n0,restrict=on -device virtio-net-pci,netdev=lab-n0,bus=pcie.0,addr=0x9
# lab-qemu: -drive file=fat:16:/etc/apt,format=raw,if=none,id=lab-d0,readonly=on -device virtio-blk-pci,drive=lab-d0,bus=pcie.0,addr=0xa
# lab-steps: net-up net-up-refused net-down-binds disk-mounted disk-mounted-refused
# lab-steps: disk-unmounted-binds end-drivers
#
# The disk is QEMU's read-only virtual FAT view of the host's /etc/apt (on every Debian host):
# something the guest can mount without an image file. Each device sits alone in its IOMMU
# group. For each: the in-use bind is refused with the reason and changes nothing; once the
# use ends the bind goes through and unbind gives the device back to virtio-pci.
NIC=0000:00:09.0
DISK=0000:00:0a.0

# $1 step, $2 address, $3 what the refusal must name
refused() {
  gpupass bind "$2" > "$1.out" 2> "$1.err"; _rc=$?
  if [ $_rc = 1 ] && grep -q "$3" "$1.err" && [ "$(lab_driver "$2")" = virtio-pci ]; then
    lab_pass "$1" "rc=1, names $3, still on virtio-pci"
  else
    lab_fail "$1" "rc=$_rc driver=$(lab_driver "$2") :: $(tr '\n' '|' < "$1.err")"
  fi
  lab_file "$1.err" "$1.err"
}
# $1 step, $2 address: bind then unbind, back on virtio-pci
round_trip() {
  if gpupass bind "$2" > "$1.out" 2>&1 && [ "$(lab_driver "$2")" = vfio-pci ] &&
    gpupass unbind "$2" >> "$1.out" 2>&1 && [ "$(lab_driver "$2")" = virtio-pci ]; then
    lab_pass "$1" "bind + unbind of $2 once unused"
  else
    lab_fail "$1" "driver=$(lab_driver "$2") :: $(tr '\n' '|' < "$1.out")"
  fi
}

# An up network interface.
ifc=$(ls /sys/bus/pci/devices/$NIC/virtio*/net 2>/dev/null | head -1)
if [ -z "$ifc" ]; then
  lab_fail net-interface "no interface on $NIC (virtio_net loaded? $(lab_driver $NIC))"
else
  ip link set "$ifc" up
  lab_expect net-up 1 "$(($(cat /sys/class/net/$ifc/flags) & 1))"
  refused net-up-refused $NIC "$ifc"
  ip link set "$ifc" down
  round_trip net-down-binds $NIC
fi

# A mounted filesystem.
blk=$(ls /sys/bus/pci/devices/$DISK/virtio*/block 2>/dev/null | head -1)
part=$(ls /sys/class/block/ | grep "^${blk}[0-9]" | head -1)
mkdir -p /mnt/lab-disk
if [ -z "$blk" ] || ! mount -t vfat -o ro,iocharset=ascii "/dev/${part:-$blk}" /mnt/lab-disk 2> mount.err; then
  lab_fail disk-mounted "cannot mount /dev/${part:-$blk} of $DISK :: $(cat mount.err 2>/dev/null)"
else
  lab_pass disk-mounted "/dev/${part:-$blk} on /mnt/lab-disk ($(ls /mnt/lab-disk | wc -l) entries)"
  refused disk-mounted-refused $DISK /mnt/lab-disk
  umount /mnt/lab-disk
  round_trip disk-unmounted-binds $DISK
fi
lab_expect end-drivers "virtio-pci virtio-pci" "$(lab_driver $NIC) $(lab_driver $DISK)"
