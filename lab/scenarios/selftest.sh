# lab-about: gpupass boot --check, the passthrough self-test, on edu (DMA, isolation, MSI, INTx), e1000e (MSI-X), the 16 GiB BAR, bochs-display and an mbochs mdev, on both VFIO backends where the kernel has iommufd; failing cases (unmapped DMA, unrouted interrupts). The guest only runs commands and ships the JSON reports with each device's config space and reset_method; tests/it/lab.rs judges the verdicts against them
# lab-needs: gpupass
# lab-timeout: 420
# lab-steps: dev-kvm
# lab-steps: edu-bind edu-facts edu-check edu-text edu-strict edu-nomap-fails edu-noirq-fails edu-backends edu-unbind edu-restored
# lab-steps: nic-bind nic-facts nic-check nic-strict nic-noirq-fails nic-unbind nic-restored
# lab-steps: big-bind big-facts big-check big-nowindow-fails big-unbind big-restored
# lab-steps: rst-bind rst-facts rst-check rst-unbind rst-restored
# lab-steps: vga-bind vga-facts vga-check vga-unbind vga-restored
# lab-steps: mdev-create mdev-check mdev-removed
#
# Each device: `gpupass bind`, its config space and reset_method shipped as NAME.config and
# NAME.reset_method (what the device really has, read by tests/it/lab.rs without gpupass),
# `gpupass boot --check --json` shipped as NAME.json (exit status 0 expected: no verdict
# fails), `gpupass unbind` back to the driver it had. `--strict` (an untested verdict fails the
# check): edu, whose every capability gpupass tests, exits 0; e1000e, whose DMA gpupass cannot
# drive (dma and isolation `untested`) and whose MSI and INTx only the host raises (`untested`),
# exits 1.

T=120 # --timeout: nested KVM under TCG is slow

lab_check dev-kvm test -c /dev/kvm

# facts NAME BDF: ship what the device has, read from sysfs, not from gpupass.
facts() {
  cp "/sys/bus/pci/devices/$2/config" "$1.config" 2>"$1.facts.err"
  cat "/sys/bus/pci/devices/$2/reset_method" > "$1.reset_method" 2>/dev/null || : > "$1.reset_method"
  if lab_file "$1.config" "$1.config" && lab_file "$1.reset_method" "$1.reset_method"; then
    lab_pass "$1-facts" "$(wc -c < "$1.config") config bytes, reset_method '$(cat "$1.reset_method")'"
  else
    lab_fail "$1-facts" "$(cat "$1.facts.err")"
  fi
}

# check NAME ARGS...: boot --check --json; exit status 0 and the report shipped.
# (lab_file sets _n and friends: these helpers keep their own names.)
check() {
  ck=$1; shift
  gpupass boot --check --json --timeout $T "$@" > "$ck.json" 2> "$ck.err"
  ckrc=$?
  lab_file "$ck.json" "$ck.json"
  if [ $ckrc -eq 0 ]; then
    lab_pass "$ck-check" "$(grep -c '"result"' "$ck.json") verdicts, none fails"
  else
    lab_fail "$ck-check" "rc=$ckrc $(grep -B1 '"result": "fail"' "$ck.json" | grep '"check"' | tr -d ' \n') $(head -3 "$ck.err")"
  fi
}

# fails STEP NAME ENV ARGS...: with the env knob set the check must exit 1 (a verdict fails).
fails() {
  fs=$1 fn=$2 fe=$3; shift 3
  env "$fe" gpupass boot --check --json --timeout $T "$@" > "$fn.json" 2> "$fn.err"
  frc=$?
  lab_file "$fn.json" "$fn.json"
  if [ $frc -eq 1 ]; then
    lab_pass "$fs" "$fe: rc=1, $(grep -c '"result": "fail"' "$fn.json") failing verdicts"
  else
    lab_fail "$fs" "$fe: rc=$frc (want 1) $(head -3 "$fn.err")"
  fi
}

# device NAME BDF [ARGS...]: bind, facts, check (with ARGS).
device() {
  dn=$1 db=$2; shift 2
  eval "orig_$dn=\$(lab_driver $db)"
  lab_run "$dn-bind" "$dn-bind.txt" gpupass bind "$db"
  facts "$dn" "$db"
  check "$dn" --device "$db" "$@"
}

undevice() {
  lab_run "$1-unbind" "$1-unbind.txt" gpupass unbind "$2"
  eval "lab_expect $1-restored \"\$orig_$1\" \"\$(lab_driver $2)\""
}

# ---- edu 00:06.0: DMA, isolation, MSI and INTx raised by the device itself
E=0000:00:06.0
device edu $E
gpupass boot --check --timeout $T --device $E > edu.txt 2> edu.txt.err
lab_file edu.txt edu.txt
if [ "$(cut -d' ' -f1 edu.txt | tr '\n' ' ')" = "config bars dma isolation msi-x msi intx reset " ]; then
  lab_pass edu-text "$(tr -s ' ' < edu.txt | cut -d' ' -f1-2 | tr '\n' ',')"
else
  lab_fail edu-text "$(tr '\n' '|' < edu.txt) $(head -3 edu.txt.err)"
fi
gpupass boot --check --strict --timeout $T --device $E > edu-strict.txt 2> edu-strict.err
rc=$?
lab_file edu-strict.txt edu-strict.txt
lab_file edu-strict.err edu-strict.err
if [ $rc = 0 ] && grep -q 'boot --check: .* 0 fail, .* 0 untested' edu-strict.err; then
  lab_pass edu-strict "$(grep 'boot --check:' edu-strict.err)"
else
  lab_fail edu-strict "rc=$rc (want 0) $(tr '\n' '|' < edu-strict.err)"
fi
fails edu-nomap-fails edu-nomap GPUPASS_BOOT_NO_DMA_MAP=1 --device $E
fails edu-noirq-fails edu-noirq GPUPASS_BOOT_NO_IRQFD=1 --device $E
if [ -e /dev/iommu ]; then
  gpupass boot --check --json --timeout $T --device $E --backend iommufd > edu-iommufd.json 2> edu-iommufd.err
  r1=$?
  gpupass boot --check --json --timeout $T --device $E --backend legacy > edu-legacy.json 2> edu-legacy.err
  r2=$?
  lab_file edu-iommufd.json edu-iommufd.json
  lab_file edu-legacy.json edu-legacy.json
  if [ $r1 -eq 0 ] && [ $r2 -eq 0 ]; then
    lab_pass edu-backends "iommufd rc=0, legacy rc=0"
  else
    lab_fail edu-backends "iommufd rc=$r1 $(head -2 edu-iommufd.err) legacy rc=$r2 $(head -2 edu-legacy.err)"
  fi
else
  lab_pass edu-backends "no /dev/iommu on this kernel: the legacy container only (edu.json)"
fi
undevice edu $E

# ---- e1000e 00:0d.0: MSI-X (5 vectors, raised by the device), MSI and INTx from the host side
N=0000:00:0d.0
device nic $N
gpupass boot --check --strict --timeout $T --device $N > nic-strict.txt 2> nic-strict.err
rc=$?
lab_file nic-strict.txt nic-strict.txt
lab_file nic-strict.err nic-strict.err
# Untested: dma and isolation (no DMA engine gpupass drives), and each interrupt kind e1000e
# has besides MSI-X (MSI, INTx: raised from the host, not by the device).
if [ $rc = 1 ] && grep -qE -- '--strict: [0-9]+ untested \(dma, isolation(, (msi|intx))*\): the device has them and gpupass could not test them' nic-strict.err && grep -q '^dma  *untested ' nic-strict.txt && grep -q '^msi-x  *pass ' nic-strict.txt; then
  lab_pass nic-strict "$(grep -- '--strict:' nic-strict.err)"
else
  lab_fail nic-strict "rc=$rc (want 1) $(tr '\n' '|' < nic-strict.err)"
fi
fails nic-noirq-fails nic-noirq GPUPASS_BOOT_NO_IRQFD=1 --device $N
undevice nic $N

# ---- ivshmem-plain 00:0c.0: the 16 GiB 64-bit BAR above 4 GiB, a 100k-read loop on it (0
# MMIO exits by KVM's count); with a 34-bit window (12 GiB above 4 GiB) it cannot be placed
B=0000:00:0c.0
device big $B --read-loop 100000 --read-bar 2
fails big-nowindow-fails big-nowindow GPUPASS_BOOT_PHYS_BITS=34 --device $B
undevice big $B

# ---- bochs-display 01:00.0 behind a root port: a bus reset before and after
R=0000:01:00.0
device rst $R
undevice rst $R

# ---- bochs-display 00:03.0: no interrupts, no DMA
V=0000:00:03.0
device vga $V
undevice vga $V

# ---- an mbochs mdev: trapped BAR2, no interrupts, no reset
U=5a1c0a3e-8f0b-4c4e-9d8f-1b2c3d4e5f60
t=$(ls -d /sys/class/mdev_bus/*/mdev_supported_types/mbochs-small 2>/dev/null | head -1)
if [ -n "$t" ] && echo $U > "$t/create"; then lab_pass mdev-create "$U on $(basename "$(dirname "$(dirname "$t")")")"; else lab_fail mdev-create "no mbochs-small type"; fi
check mdev --mdev $U
echo 1 > /sys/bus/mdev/devices/$U/remove
lab_check mdev-removed test ! -e /sys/bus/mdev/devices/$U
