# lab-about: a group shared by unrelated devices (conventional PCI behind a PCIe-to-PCI bridge) is refused on the real kernel, naming the other member and the ways out; --only binds the named one alone
# lab-needs: gpupass
# lab-qemu: -device pcie-pci-bridge,id=lab-pb,bus=pcie.0,addr=0xb -device edu,bus=lab-pb,addr=0x1 -device pci-testdev,bus=lab-pb,addr=0x2
# lab-steps: one-group members mixed-refused only-binds only-unbind end-driver
#
# Devices behind a PCIe-to-PCI bridge reach the IOMMU with the bridge's requester ID, so the
# kernel puts the bridge and both devices in one IOMMU group: the edu device and the test device
# cannot be given to different owners. That is the "group N is not viable" users meet with
# GPUs behind switches without ACS.
find_dev() { # VENDOR DEVICE -> address, behind a bridge (the lab has an edu and a test device
  # on the root bus too)
  for d in /sys/bus/pci/devices/*; do
    case $(basename $d) in 0000:00:*) continue ;; esac
    [ "$(cat $d/vendor)" = "$1" ] && [ "$(cat $d/device)" = "$2" ] && { basename $d; return; }
  done
}
EDU=$(find_dev 0x1234 0x11e8)
TEST=$(find_dev 0x1b36 0x0005)
if [ -z "$EDU" ] || [ -z "$TEST" ]; then
  lab_fail devices "edu=$EDU testdev=$TEST: not found"
  return 0 2> /dev/null || exit 0
fi
g=$(lab_group $EDU)
lab_expect one-group "$g" "$(lab_group $TEST)"
lab_pass members "group $g: $(ls /sys/kernel/iommu_groups/$g/devices | tr '\n' ' ')"

gpupass bind $EDU > mixed.out 2> mixed.err; rc=$?
cat mixed.err
lab_file mixed.err mixed.err
if [ $rc = 1 ] && grep -q "$TEST" mixed.err && grep -q -- "--only" mixed.err && [ -z "$(lab_driver $EDU)" ]; then
  lab_pass mixed-refused "rc=1, names $TEST and --only, nothing bound"
else
  lab_fail mixed-refused "rc=$rc driver=$(lab_driver $EDU) :: $(tr '\n' '|' < mixed.err)"
fi

# --only binds the named device alone. The test device has no driver, which does not block
# viability, so the group is usable (no warning); a member on a host driver would make it not.
gpupass bind --only $EDU > only.out 2> only.err; rc=$?
lab_file only.out only.out
if [ $rc = 0 ] && [ "$(lab_driver $EDU)" = vfio-pci ] && [ -z "$(lab_driver $TEST)" ] && [ -c /dev/vfio/$g ] &&
  grep -q "IOMMU group $g is viable" only.out; then
  lab_pass only-binds "$EDU alone on vfio-pci, $TEST untouched; group $g viable (its other member has no driver)"
else
  lab_fail only-binds "rc=$rc driver=$(lab_driver $EDU) :: $(tr '\n' '|' < only.out) $(tr '\n' '|' < only.err)"
fi
lab_check only-unbind gpupass unbind $EDU
lab_expect end-driver "" "$(lab_driver $EDU)"
