# lab-about: E-BIND-19 on the real kernel: a device claimed through vfio_pci.ids= on the kernel command line goes back to vfio-pci when unbound (rolled back); with the ID taken out of vfio-pci's table the unbind goes through
# lab-needs: gpupass
# lab-qemu: -device virtio-rng-pci,disable-legacy=on,bus=pcie.0,addr=0x10
# lab-append: vfio_pci.ids=1af4:1044
# lab-timeout: 60
# lab-steps: device id-unique cmdline start-driver virtio-pci-unloaded ids-claim virtio-pci-reloaded
# lab-steps: others-restored e-bind-19 e-bind-19-rolled-back e-bind-19-journal-closed remove-id
# lab-steps: unbind-after-remove-id unbind-claimed-by-native new-id new-id-leaves-it journal-bind
# lab-steps: journal-unbind-refused journal-unbind-rolled-back journal-unbind end-driver
# lab-steps: journal-closed
#
# The boot puts `vfio_pci.ids=1af4:1044` on the kernel command line (lab-append). 1af4:1044 is a
# modern-only virtio-rng (lab-qemu, 00:10.0) that only this scenario adds: no other lab device
# has that ID, so the ids table takes nothing else and the shared boot is unaffected. Its host
# driver is virtio-pci, a module on both legs (Debian's 6.1 and the lab's 6.12); nothing binds
# on the virtio bus (virtio_rng is not loaded on 6.1, not built on 6.12).
#
# The guest's modprobe is busybox's: it reads a module's parameters from /proc/cmdline as
# `<module name>.<param>=`, with the module name as modprobe spells it (vfio_pci), and does not
# fold `vfio-pci.` to it as kmod's modprobe does. Hence the underscore here; on a distribution
# both spellings work.
#
# Which driver a reprobe (drivers_probe) gives a device is the first registered driver that
# matches it. The init loads virtio_pci before vfio-pci, so at the start the device is on
# virtio-pci and a reprobe would always give it back to virtio-pci. A host with vfio-pci.ids=
# loads vfio-pci first (initramfs, softdep), and that is what the scenario sets up: unload
# virtio_pci (every virtio device is released), probe 00:10.0 alone (only vfio-pci is left to
# claim it, through its ids table: that is the claim the command line makes), load virtio_pci
# again (it takes back every other virtio device; checked). From then on vfio-pci is ahead of
# virtio-pci, as on such a host.
DEV=0000:00:10.0
ID="1af4 1044"
P=/sys/bus/pci
ovr() { cat $P/devices/$DEV/driver_override 2>/dev/null; }
# journal_clear STEP: no unfinished gpupass plan touches DEV (one another scenario left open is
# that scenario's failure, not this one's; the step says so)
journal_clear() {
  gpupass recover --dry-run > "$1.txt" 2>&1
  if grep -q "nothing to recover" "$1.txt"; then
    lab_pass "$1" "no unfinished plan"
  elif ! grep -q "$DEV" "$1.txt"; then
    lab_pass "$1" "no unfinished plan touches $DEV (another is open: $(head -1 "$1.txt"))"
  else
    lab_fail "$1" "$(tr '\n' '|' < "$1.txt")"
  fi
}
# the gpupass error line of a stderr file (warnings about other plans may come first)
errline() { grep -m1 '^gpupass: ' "$1" || head -1 "$1"; }
# every PCI function but DEV with its driver, one line each
others() { for d in $P/devices/*; do b=${d##*/}; [ "$b" = $DEV ] || echo "$b $(lab_driver "$b")"; done; }

lab_expect device "0x1af4 0x1044" "$(cat $P/devices/$DEV/vendor $P/devices/$DEV/device 2>/dev/null | tr '\n' ' ' | sed 's/ $//')"
n=0
for d in $P/devices/*; do [ "$(cat "$d/vendor") $(cat "$d/device")" = "0x1af4 0x1044" ] && n=$((n + 1)); done
lab_expect id-unique 1 "$n"
if grep -qw "vfio_pci.ids=1af4:1044" /proc/cmdline; then
  lab_pass cmdline "$(grep -o 'vfio_pci.ids=[^ ]*' /proc/cmdline)"
else
  lab_fail cmdline "not on the kernel command line: $(cat /proc/cmdline)"
fi
lab_expect start-driver virtio-pci "$(lab_driver $DEV)"

# vfio-pci ahead of virtio-pci; vfio-pci claims 00:10.0 through its ids table.
others > others-before.txt
if rmmod virtio_pci 2> rmmod.err; then
  lab_expect virtio-pci-unloaded "" "$(lab_driver $DEV)"
  echo $DEV > $P/drivers_probe
  lab_expect ids-claim "vfio-pci (null)" "$(lab_driver $DEV) $(ovr)"
else
  lab_fail virtio-pci-unloaded "rmmod virtio_pci: $(cat rmmod.err)"
fi
lab_check virtio-pci-reloaded modprobe virtio_pci
sleep 0.3
others > others-after.txt
if cmp -s others-before.txt others-after.txt; then
  lab_pass others-restored "every other function on the driver it had ($(grep -c ' virtio-pci$' others-after.txt) back on virtio-pci)"
else
  lab_fail others-restored "$(diff others-before.txt others-after.txt | grep '^[-+]0' | tr '\n' '|')"
fi

# E-BIND-19: 00:10.0 is on vfio-pci through the ids table, not through gpupass (no journal
# entry). unbind clears the override, unbinds and reprobes; vfio-pci claims it again: an error,
# rolled back, exit 1.
gpupass unbind $DEV > e19.txt 2> e19.err
rc=$?
cat e19.txt e19.err
lab_file e19.err e19.err
if [ $rc = 1 ] && grep -q "$DEV went back to vfio-pci on reprobe (vfio-pci.ids=" e19.err && grep -q "rolled back" e19.err; then
  lab_pass e-bind-19 "rc=1: $(errline e19.err)"
else
  lab_fail e-bind-19 "rc=$rc :: $(tr '\n' '|' < e19.err)"
fi
lab_expect e-bind-19-rolled-back "vfio-pci (null)" "$(lab_driver $DEV) $(ovr)"
journal_clear e-bind-19-journal-closed

# The way out the error names, without a reboot: take the ID out of vfio-pci's table
# (remove_id: what dropping vfio-pci.ids= does at the next boot). The same unbind goes through
# and the reprobe gives the device to its host driver.
lab_check remove-id sh -c "echo $ID > $P/drivers/vfio-pci/remove_id"
lab_run unbind-after-remove-id unbind2.txt gpupass unbind $DEV
if grep -q "$DEV: reprobed, claimed by virtio-pci" unbind2.txt && [ "$(lab_driver $DEV)" = virtio-pci ]; then
  lab_pass unbind-claimed-by-native "$(grep "$DEV: reprobed" unbind2.txt)"
else
  lab_fail unbind-claimed-by-native "driver=$(lab_driver $DEV) :: $(tr '\n' '|' < unbind2.txt)"
fi

# The user's path: the ID back in the table (new_id: the boot's state; it claims only devices
# without a driver, so 00:10.0 stays on virtio-pci), then gpupass bind, then unbind. The journal
# names virtio-pci as the driver to restore; vfio-pci takes the device on the reprobe, the check
# fails, and the unbind is rolled back to vfio-pci.
lab_check new-id sh -c "echo $ID > $P/drivers/vfio-pci/new_id"
lab_expect new-id-leaves-it virtio-pci "$(lab_driver $DEV)"
lab_run journal-bind jbind.txt gpupass bind $DEV
gpupass unbind $DEV > junbind.txt 2> junbind.err
rc=$?
cat junbind.txt junbind.err
lab_file junbind.err junbind.err
if [ $rc = 1 ] && grep -q "rolled back" junbind.err && grep -q "$DEV is bound to vfio-pci" junbind.err; then
  lab_pass journal-unbind-refused "rc=1: $(errline junbind.err)"
else
  lab_fail journal-unbind-refused "rc=$rc :: $(tr '\n' '|' < junbind.err)"
fi
lab_expect journal-unbind-rolled-back "vfio-pci vfio-pci" "$(lab_driver $DEV) $(ovr)"
# Clean up: out of the table, unbind (to virtio-pci), back into the table as the boot left it.
echo $ID > $P/drivers/vfio-pci/remove_id
lab_run journal-unbind junbind2.txt gpupass unbind $DEV
echo $ID > $P/drivers/vfio-pci/new_id
lab_expect end-driver "virtio-pci (null)" "$(lab_driver $DEV) $(ovr)"
journal_clear journal-closed
