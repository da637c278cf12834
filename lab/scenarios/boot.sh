# lab-about: gpupass boot: the VMM in nested KVM with a VFIO bochs-display (mmapped BAR), the 16 GiB BAR, reset, DMA and isolation through the IOMMU (edu), and an mbochs mdev (trapped BAR)
# lab-needs: gpupass
# lab-timeout: 300
# lab-steps: dev-kvm emulated emulated-dispi emulated-json-status emulated-timing
# lab-steps: refuses-unbound bind bind-driver vfio vfio-dev vfio-dispi vfio-bar2-slot
# lab-steps: vfio-loop-rc vfio-loop-exits-mmapped vfio-kvm-mmio vfio-timing vfio-timing-1 vfio-timing-2
# lab-steps: vfio-timing-3 vfio-reset-none unbind restored
# lab-steps: big-markers big-bind big-bind-driver big-boot big-window big-above-4g big-first-last
# lab-steps: big-slot big-loop-rc big-loop-exits big-kvm-mmio big-timing big-reset-none big-unbind big-restored
# lab-steps: rst-method rst-bind rst-bind-driver rst-boot rst-summary rst-json-rc rst-flag rst-kernel-method
# lab-steps: rst-before rst-after rst-dispi rst-timing rst-unbind rst-restored
# lab-steps: edu-bind edu-bind-driver edu-boot edu-dev edu-dma edu-iso edu-dma-summary edu-iso-summary
# lab-steps: edu-dmar-fault edu-json-rc edu-json-dma edu-json-matched edu-json-iso edu-json-saw
# lab-steps: edu-json-kernel-fault edu-timing edu-legacy-rc edu-legacy-dma edu-legacy-iso edu-legacy-timing
# lab-steps: edu-nomap-rc edu-nomap-skipped edu-nomap-dma edu-nomap-iso edu-nomap-faults edu-nomap-summary
# lab-steps: edu-unbind edu-restored
# lab-steps: bind-only bind-only-driver group-not-viable
# lab-steps: unbind-only vga-restored mdev-create mdev mdev-dev mdev-dispi mdev-bar2-trapped
# lab-steps: mdev-reset mdev-loop-rc mdev-loop-exits-trapped mdev-kvm-mmio mdev-timing mdev-removed triple-fault timeout
#
# Binding is `gpupass bind` / `gpupass unbind` only, each its own step: a failing bind or unbind
# fails the scenario (there is no fallback to plain sysfs writes).

T=120          # gpupass boot --timeout (nested KVM under TCG is slow)
LOOP=100000    # reads in the exit-counting loops

# json_get FILE KEY: first number after "KEY": in a pretty-printed JSON file.
json_get() { grep -m1 "\"$2\":" "$1" | sed 's/.*: *//; s/,$//'; }

# loop_exits FILE: exits counted between the firmware's loop marks.
loop_exits() { sed -n '/"read_loop": {/,/"timing"/p' "$1" | grep -m1 '"total":' | sed 's/.*: *//; s/,$//'; }
# kvm_loop FILE NAME: KVM's own counter NAME over the read loop (KVM_GET_STATS_FD)
# reset_ok FILE before|after: "ok" of that VFIO_DEVICE_RESET in the JSON report
reset_ok() { sed -n "/\"$2\": {/,/}/p" "$1" | grep -m1 '"ok":' | sed 's/.*: *//; s/,$//'; }
# reset_us FILE before|after: its duration in microseconds
reset_us() { sed -n "/\"$2\": {/,/}/p" "$1" | grep -m1 '"micros":' | sed 's/.*: *//; s/,$//'; }
# obj_get FILE OBJ KEY: KEY inside the JSON object "OBJ": {...} (no nested objects before KEY)
obj_get() { sed -n "/\"$2\": {/,/}/p" "$1" | grep -m1 "\"$3\":" | sed 's/.*: *//; s/,$//'; }
kvm_loop() { sed -n '/"read_loop": {/,/"timing"/p' "$1" | sed -n '/"kvm": {/,$p' | grep -m1 "\"$2\":" | sed 's/.*: *//; s/,$//'; }

lab_check dev-kvm test -c /dev/kvm

# ---- 1. emulated device under nested KVM
lab_run emulated emulated.txt gpupass boot --emulated --timeout $T
lab_expect emulated-dispi "FW dispi 00:01.0 0xb0c5" "$(grep '^FW dispi' emulated.txt)"
gpupass boot --emulated --timeout $T --json > emulated.json 2> emulated.err
lab_expect emulated-json-status 0 "$(json_get emulated.json status)"
lab_pass emulated-timing "total_us=$(json_get emulated.json total_us) run_us=$(json_get emulated.json run_us) setup_us=$(json_get emulated.json setup_us) exits=$(json_get emulated.json total)"
lab_file emulated.json emulated.json

# ---- 2. bochs-display 00:03.0 through VFIO (BAR2 mmappable -> KVM slot)
D=0000:00:03.0
orig=$(lab_driver $D)
gpupass boot --device $D --timeout $T > notbound.txt 2> notbound.err
rc=$?
if [ $rc = 1 ] && grep -q "run \`gpupass bind $D\` first" notbound.err; then
  lab_pass refuses-unbound "$(cat notbound.err)"
else
  lab_fail refuses-unbound "rc=$rc $(cat notbound.err)"
fi
lab_run bind bind.txt gpupass bind $D
lab_expect bind-driver vfio-pci "$(lab_driver $D)"
lab_run vfio vfio.txt gpupass boot --device $D --timeout $T
lab_expect vfio-dev "1234:1111" "$(grep "^FW dev 00:01.0" vfio.txt | cut -d" " -f4)"
lab_expect vfio-dispi "FW dispi 00:01.0 0xb0c5" "$(grep '^FW dispi' vfio.txt)"
if grep -q '^gpupass: BAR2 +0x0 (4 KiB) mapped as KVM slot' vfio.txt.stderr; then
  lab_pass vfio-bar2-slot "$(grep '^gpupass: BAR2' vfio.txt.stderr | head -1)"
else
  lab_fail vfio-bar2-slot "BAR2 not a KVM slot: $(tr '\n' ' ' < vfio.txt.stderr)"
fi
gpupass boot --device $D --timeout $T --json --read-loop $LOOP --read-bar 2 > vfio-loop.json 2> vfio-loop.err
rc=$?
lab_expect vfio-loop-rc 0 "$rc"
lab_expect vfio-loop-exits-mmapped 0 "$(loop_exits vfio-loop.json)"
lab_expect vfio-kvm-mmio 0 "$(kvm_loop vfio-loop.json mmio_exits)"
lab_pass vfio-timing "total_us=$(json_get vfio-loop.json total_us) setup_us=$(json_get vfio-loop.json setup_us) dma_mapped=$(json_get vfio-loop.json dma_mapped) loop_ns=$(json_get vfio-loop.json nanos)"
lab_file vfio-loop.json vfio-loop.json
for i in 1 2 3; do
  gpupass boot --device $D --timeout $T --json > vfio-t$i.json 2>/dev/null
  lab_pass vfio-timing-$i "total_us=$(json_get vfio-t$i.json total_us) setup_us=$(json_get vfio-t$i.json setup_us) run_us=$(json_get vfio-t$i.json run_us)"
done
# Root-bus lab devices have no reset method (no sysfs reset_method, VFIO_DEVICE_FLAGS_RESET clear).
if grep -q '^gpupass: reset: none: the device has no reset method (no sysfs reset_method; VFIO_DEVICE_FLAGS_RESET not set)' vfio.txt.stderr; then
  lab_pass vfio-reset-none "$(grep '^gpupass: reset' vfio.txt.stderr)"
else
  lab_fail vfio-reset-none "$(grep '^gpupass: reset' vfio.txt.stderr) (reset_method: '$(cat /sys/bus/pci/devices/$D/reset_method 2>&1)')"
fi
lab_run unbind unbind.txt gpupass unbind $D
lab_expect restored "$orig" "$(lab_driver $D)"

# ---- 2b. the 16 GiB 64-bit BAR2 of ivshmem-plain 00:0c.0: the firmware (long mode) places it
# above 4 GiB, it becomes a KVM slot, its first and last dwords are read, and a read loop on it
# exits 0 times by KVM's count. Markers are written to the BAR's first and last dword first
# (busybox devmem at L1's own BAR address, while no driver has it), so "first"/"last" prove the
# guest reached both ends of the real BAR, not just any zero page.
B=0000:00:0c.0
borig=$(lab_driver $B)
set -- $(sed -n 3p /sys/bus/pci/devices/$B/resource)
bfirst=$(printf '0x%x' $(( $1 )))
blast=$(printf '0x%x' $(( $2 - 3 )))
# busybox devmem maps two pages for an access in a page's last 32 bytes (it compares the offset
# with the width in bits), and the page after this BAR is 00:04.0's busy virtio BAR: 6.1 (Debian,
# IO_STRICT_DEVMEM) refuses that mapping (EPERM), so there the last dword keeps the sparse
# file's 0 and only the first carries a marker.
devmem $bfirst 32 0x47504231
devmem $blast 32 0x4c415354 2> big-devmem.err
got="$(devmem $bfirst 32) $(devmem $blast 32 2>> big-devmem.err)"
lastmark=0x4c415354
if [ "$got" = "0x47504231 0x4C415354" ]; then
  lab_pass big-markers "$bfirst=0x47504231 $blast=0x4C415354"
elif [ "$got" = "0x47504231 " ] && grep -q 'Operation not permitted' big-devmem.err; then
  lastmark=0x0
  lab_pass big-markers "$bfirst=0x47504231; $blast not writable from L1 here (devmem's two-page mapping meets the busy page after the BAR: $(head -1 big-devmem.err)), so 'last' must read the file's 0"
else
  lab_fail big-markers "got '$got' $(tr '\n' ' ' < big-devmem.err)"
fi
lab_run big-bind big-bind.txt gpupass bind $B
lab_expect big-bind-driver vfio-pci "$(lab_driver $B)"
lab_run big-boot big.txt gpupass boot --device $B --timeout $T
hello=$(grep '^FW hello' big.txt)
case "$hello" in
  *" mmio64 0x100000000-"*) lab_pass big-window "$hello; $(grep '^gpupass: guest physical' big.txt.stderr)" ;;
  *) lab_fail big-window "no 64-bit window: '$hello'" ;;
esac
bar2=$(grep '^FW bar 2 ' big.txt)
baddr=$(echo "$bar2" | sed -n 's/.* addr \(0x[0-9a-f]*\) .*/\1/p')
if [ -n "$baddr" ] && [ $(( baddr >= (1 << 32) )) = 1 ] && echo "$bar2" | grep -q ' mem64 pref .* size 0x400000000 '; then
  lab_pass big-above-4g "$bar2"
else
  lab_fail big-above-4g "'$bar2'"
fi
lab_expect big-first-last "first 0x47504231 last $lastmark" "$(echo "$bar2" | sed -n 's/.* \(first .*\)/\1/p')"
if grep -q "^gpupass: BAR2 +0x0 (16 GiB) mapped as KVM slot [0-9]* at $baddr:" big.txt.stderr; then
  lab_pass big-slot "$(grep '^gpupass: BAR2' big.txt.stderr | head -1)"
else
  lab_fail big-slot "BAR2 not a KVM slot at '$baddr': $(tr '\n' ' ' < big.txt.stderr)"
fi
gpupass boot --device $B --timeout $T --json --read-loop $LOOP --read-bar 2 > big-loop.json 2> big-loop.err
lab_expect big-loop-rc 0 "$?"
lab_expect big-loop-exits 0 "$(loop_exits big-loop.json)"
lab_expect big-kvm-mmio 0 "$(kvm_loop big-loop.json mmio_exits)"
lab_pass big-timing "total_us=$(json_get big-loop.json total_us) setup_us=$(json_get big-loop.json setup_us) loop_ns=$(json_get big-loop.json nanos) kvm_exits=$(kvm_loop big-loop.json exits) kvm_io=$(kvm_loop big-loop.json io_exits) kvm_irq=$(kvm_loop big-loop.json irq_exits) phys_bits=$(json_get big-loop.json guest_phys_bits)"
lab_file big.txt big.txt
lab_file big-loop.json big-loop.json
if grep -q '^gpupass: reset: none: ' big.txt.stderr && [ ! -e /sys/bus/pci/devices/$B/reset_method ]; then
  lab_pass big-reset-none "$(grep '^gpupass: reset' big.txt.stderr)"
else
  lab_fail big-reset-none "$(grep '^gpupass: reset' big.txt.stderr) (reset_method: '$(cat /sys/bus/pci/devices/$B/reset_method 2>&1)')"
fi
lab_run big-unbind big-unbind.txt gpupass unbind $B
lab_expect big-restored "$borig" "$(lab_driver $B)"

# ---- 2c. reset: the bochs-display behind the root port (01:00.0) is the lab's one function with
# a reset method (`bus`: a secondary bus reset of rp1). gpupass resets it with VFIO_DEVICE_RESET
# before and after the run and names the method.
R=0000:01:00.0
rorig=$(lab_driver $R)
lab_expect rst-method bus "$(cat /sys/bus/pci/devices/$R/reset_method 2>&1)"
lab_run rst-bind rst-bind.txt gpupass bind $R
lab_expect rst-bind-driver vfio-pci "$(lab_driver $R)"
lab_run rst-boot rst.txt gpupass boot --device $R --timeout $T
line=$(grep '^gpupass: reset:' rst.txt.stderr)
case "$line" in
  "gpupass: reset: VFIO_DEVICE_RESET (kernel method bus; sysfs reset_method: bus): before the run ok in "*", after ok in "*) lab_pass rst-summary "$line" ;;
  *) lab_fail rst-summary "'$line'" ;;
esac
gpupass boot --device $R --timeout $T --json > rst.json 2> rst.err
lab_expect rst-json-rc 0 "$?"
lab_expect rst-flag true "$(json_get rst.json vfio_reset_flag)"
lab_expect rst-kernel-method '"bus"' "$(json_get rst.json method)"
lab_expect rst-before true "$(reset_ok rst.json before)"
lab_expect rst-after true "$(reset_ok rst.json after)"
lab_expect rst-dispi "FW dispi 00:01.0 0xb0c5" "$(grep '^FW dispi' rst.txt)"
lab_pass rst-timing "before_us=$(reset_us rst.json before) after_us=$(reset_us rst.json after) total_us=$(json_get rst.json total_us) setup_us=$(json_get rst.json setup_us)"
lab_file rst.json rst.json
lab_run rst-unbind rst-unbind.txt gpupass unbind $R
lab_expect rst-restored "$rorig" "$(lab_driver $R)"

# ---- 2d. DMA through the IOMMU: QEMU's edu 00:06.0. The firmware copies a 4 KiB pattern
# RAM -> edu's buffer -> RAM (guest RAM DMA-mapped at IOVA = GPA) and compares, then has edu read
# from the first IOVA past guest RAM (0x4000000 with the default 64 MiB), which is not mapped: the
# IOMMU must block it (the device gets no data) and L1's kernel logs a DMAR fault for 00:06.0 at
# that address (read here with dmesg, and by gpupass itself from /dev/kmsg). A run with
# GPUPASS_BOOT_NO_DMA_MAP=1 (guest RAM not DMA-mapped) must fail the DMA check.
E=0000:00:06.0
eorig=$(lab_driver $E)
lab_run edu-bind edu-bind.txt gpupass bind $E
lab_expect edu-bind-driver vfio-pci "$(lab_driver $E)"
n0=$(dmesg | wc -l)
lab_run edu-boot edu.txt gpupass boot --device $E --timeout $T
lab_expect edu-dev "1234:11e8" "$(grep "^FW dev 00:01.0" edu.txt | cut -d" " -f4)"
line=$(grep '^FW dma ' edu.txt)
case "$line" in
  "FW dma 00:01.0 bytes 4096 to-device ok polls "*" from-device ok polls "*" match 4096 first-mismatch none seed "*) lab_pass edu-dma "$line" ;;
  *) lab_fail edu-dma "'$line'" ;;
esac
line=$(grep '^FW iso ' edu.txt)
case "$line" in
  "FW iso 00:01.0 iova 0x4000000 bytes 4096 read ok polls "*" copy-back ok polls "*" saw "zeros|*" saw "ones|*" saw "unchanged) lab_pass edu-iso "$line" ;;
  *) lab_fail edu-iso "'$line'" ;;
esac
if grep -q '^gpupass: DMA: pass: 4096 bytes copied RAM -> device -> RAM through the IOMMU, all equal' edu.txt.stderr; then
  lab_pass edu-dma-summary "$(grep '^gpupass: DMA:' edu.txt.stderr)"
else
  lab_fail edu-dma-summary "$(grep '^gpupass: \(DMA\|isolation\)' edu.txt.stderr)"
fi
if grep -q '^gpupass: isolation: pass: the device read no data from unmapped IOVA 0x4000000' edu.txt.stderr; then
  lab_pass edu-iso-summary "$(grep '^gpupass: isolation:' edu.txt.stderr)"
else
  lab_fail edu-iso-summary "$(grep '^gpupass: isolation' edu.txt.stderr)"
fi
dmesg | tail -n +$((n0 + 1)) > edu-dmesg.txt
line=$(grep -m1 'DMAR: \[DMA Read[^]]*\] Request device \[00:06.0\] fault addr 0x4000000' edu-dmesg.txt)
if [ -n "$line" ]; then lab_pass edu-dmar-fault "$line"; else lab_fail edu-dmar-fault "no DMAR read fault at 0x4000000 for 00:06.0: $(grep -i 'dmar\|iommu' edu-dmesg.txt | tr '\n' ' ')"; fi
lab_file edu-dmesg.txt edu-dmesg.txt
gpupass boot --device $E --timeout $T --json > edu.json 2> edu.err
lab_expect edu-json-rc 0 "$?"
lab_expect edu-json-dma '"pass"' "$(obj_get edu.json dma result)"
lab_expect edu-json-matched 4096 "$(obj_get edu.json dma matched)"
lab_expect edu-json-iso '"pass"' "$(obj_get edu.json isolation result)"
saw=$(obj_get edu.json isolation saw)
case "$saw" in '"zeros"'|'"ones"'|'"unchanged"') lab_pass edu-json-saw "$saw" ;; *) lab_fail edu-json-saw "'$saw'" ;; esac
line=$(grep -m1 '"kernel_fault_at_iova":' edu.json)
case "$line" in
  *'"DMAR: [DMA Read'*'Request device [00:06.0] fault addr 0x4000000'*) lab_pass edu-json-kernel-fault "$line" ;;
  *) lab_fail edu-json-kernel-fault "'$line' $(grep -A3 '"kernel_faults": {' edu.json | tr '\n' ' ')" ;;
esac
lab_pass edu-timing "backend=$(json_get edu.json backend) dma_ns=$(obj_get edu.json dma nanos) iso_ns=$(obj_get edu.json isolation nanos) polls=$(obj_get edu.json dma to_device_polls)/$(obj_get edu.json dma from_device_polls) dma_mapped=$(json_get edu.json dma_mapped) total_us=$(json_get edu.json total_us)"
lab_file edu.json edu.json
# The same through the legacy container (auto picks iommufd where the kernel has it).
gpupass boot --device $E --timeout $T --json --backend legacy > edu-legacy.json 2> edu-legacy.err
lab_expect edu-legacy-rc 0 "$?"
lab_expect edu-legacy-dma '"pass"' "$(obj_get edu-legacy.json dma result)"
lab_expect edu-legacy-iso '"pass"' "$(obj_get edu-legacy.json isolation result)"
lab_pass edu-legacy-timing "backend=$(json_get edu-legacy.json backend) dma_ns=$(obj_get edu-legacy.json dma nanos) saw=$(obj_get edu-legacy.json isolation saw)"
lab_file edu-legacy.json edu-legacy.json
# The check can fail: guest RAM not DMA-mapped, so edu's read of the source and its write of the
# destination both fault, and the destination keeps its fill. The kernel rate-limits DMAR fault
# lines (dmar_fault: 10 lines per 5 s, the "handling fault status" line included; the three runs
# above used 6), so wait for a fresh window before looking for these two.
sleep 6
n0=$(dmesg | wc -l)
GPUPASS_BOOT_NO_DMA_MAP=1 gpupass boot --device $E --timeout $T --json > edu-nomap.json 2> edu-nomap.err
lab_expect edu-nomap-rc 0 "$?"
lab_expect edu-nomap-skipped "true 0" "$(json_get edu-nomap.json dma_map_skipped) $(json_get edu-nomap.json dma_mapped)"
lab_expect edu-nomap-dma '"fail"' "$(obj_get edu-nomap.json dma result)"
lab_expect edu-nomap-iso "null" "$(json_get edu-nomap.json isolation)"
dmesg | tail -n +$((n0 + 1)) > edu-nomap-dmesg.txt
r=$(grep -m1 'DMAR: \[DMA Read[^]]*\] Request device \[00:06.0\] fault addr 0x80000 ' edu-nomap-dmesg.txt)
w=$(grep -m1 'DMAR: \[DMA Write[^]]*\] Request device \[00:06.0\] fault addr 0x81000 ' edu-nomap-dmesg.txt)
if [ -n "$r" ] && [ -n "$w" ]; then lab_pass edu-nomap-faults "$r / $w"; else lab_fail edu-nomap-faults "read '$r' write '$w': $(grep -i dmar edu-nomap-dmesg.txt | tr '\n' ' ')"; fi
GPUPASS_BOOT_NO_DMA_MAP=1 gpupass boot --device $E --timeout $T > edu-nomap.txt 2> edu-nomap.txt.stderr
if grep -q '^gpupass: DMA: fail: ' edu-nomap.txt.stderr; then
  lab_pass edu-nomap-summary "$(grep '^gpupass: \(guest RAM NOT\|DMA\)' edu-nomap.txt.stderr | tr '\n' ' ')"
else
  lab_fail edu-nomap-summary "$(tr '\n' ' ' < edu-nomap.txt.stderr)"
fi
lab_file edu-nomap.json edu-nomap.json
lab_file edu-nomap-dmesg.txt edu-nomap-dmesg.txt
lab_run edu-unbind edu-unbind.txt gpupass unbind $E
lab_expect edu-restored "$eorig" "$(lab_driver $E)"

# ---- 3. a group with one function on vfio-pci is refused with the member that blocks it
V=0000:00:05.0
vorig=$(lab_driver $V)
lab_run bind-only bind-only.txt gpupass bind --only $V
lab_expect bind-only-driver vfio-pci "$(lab_driver $V)"
gpupass boot --device $V --timeout $T > nv.txt 2> nv.err
rc=$?
if [ $rc = 1 ] && grep -q "not viable: it also holds 0000:00:05.1 (snd_hda_intel)" nv.err; then
  lab_pass group-not-viable "$(cat nv.err)"
else
  lab_fail group-not-viable "rc=$rc $(cat nv.err)"
fi
lab_run unbind-only unbind-only.txt gpupass unbind $V
lab_expect vga-restored "$vorig" "$(lab_driver $V)"

# ---- 4. mbochs mdev (BAR2 not mmappable -> trapped, forwarded with region reads)
U=6b8f3c2e-5a1d-4e7b-9c0a-1f2e3d4c5b6a
t=$(ls -d /sys/class/mdev_bus/*/mdev_supported_types/mbochs-small 2>/dev/null | head -1)
if [ -n "$t" ] && echo $U > "$t/create"; then lab_pass mdev-create "$U on $(basename "$(dirname "$(dirname "$t")")")"; else lab_fail mdev-create "no mbochs-small type"; fi
lab_run mdev mdev.txt gpupass boot --mdev $U --timeout $T
lab_expect mdev-dev "1234:1111" "$(grep "^FW dev 00:01.0" mdev.txt | cut -d" " -f4)"
lab_expect mdev-dispi "FW dispi 00:01.0 0xb0c5" "$(grep '^FW dispi' mdev.txt)"
if grep -q '^gpupass: BAR2 trapped: VFIO region is not mmappable' mdev.txt.stderr; then
  lab_pass mdev-bar2-trapped "$(grep '^gpupass: BAR' mdev.txt.stderr | tr '\n' ' ')"
else
  lab_fail mdev-bar2-trapped "$(tr '\n' ' ' < mdev.txt.stderr)"
fi
line=$(grep '^gpupass: reset:' mdev.txt.stderr)
case "$line" in
  # mbochs does not set VFIO_DEVICE_FLAGS_RESET: the mdev is not reset, and the report says so.
  "gpupass: reset: none: the device has no reset method (no sysfs reset_method; VFIO_DEVICE_FLAGS_RESET not set), not reset") lab_pass mdev-reset "$line" ;;
  *) lab_fail mdev-reset "'$line'" ;;
esac
gpupass boot --mdev $U --timeout $T --json --read-loop $LOOP --read-bar 2 > mdev-loop.json 2> mdev-loop.err
lab_expect mdev-loop-rc 0 "$?"
lab_expect mdev-loop-exits-trapped $LOOP "$(loop_exits mdev-loop.json)"
lab_expect mdev-kvm-mmio $LOOP "$(kvm_loop mdev-loop.json mmio_exits)"
lab_pass mdev-timing "total_us=$(json_get mdev-loop.json total_us) loop_ns=$(json_get mdev-loop.json nanos)"
lab_file mdev-loop.json mdev-loop.json
echo 1 > /sys/bus/mdev/devices/$U/remove
lab_check mdev-removed test ! -e /sys/bus/mdev/devices/$U

# ---- 5. faults under real (nested SVM) KVM: a triple fault is KVM_EXIT_SHUTDOWN here, and a
# spinning guest is stopped by --timeout. The bytes are firmware/tests/{triple,spin}.S as
# build.rs assembles them (the initramfs carries only /bin/gpupass).
printf '\372\061\300\216\330\146\017\001\026\110\020\017\040\300\146\203\310\001\017\042\300\146\352\035\020\000\000\010\000\146\270\020\000\216\330\216\320\017\001\035\116\020\000\000\314\364\146\220\000\000\000\000\000\000\000\000\377\377\000\000\000\232\317\000\377\377\000\000\000\222\317\000\027\000\060\020\000\000\000\000\000\000\000\000' > triple.bin
gpupass boot --emulated --timeout $T --firmware triple.bin > triple.txt 2> triple.err
rc=$?
if [ $rc = 1 ] && grep -q "triple-faulted (KVM_EXIT_SHUTDOWN)" triple.err; then
  lab_pass triple-fault "$(head -1 triple.err)"
else
  lab_fail triple-fault "rc=$rc $(tr '\n' ' ' < triple.err)"
fi
printf '\353\376' > spin.bin
gpupass boot --emulated --timeout 2 --firmware spin.bin > spin.txt 2> spin.err
rc=$?
if [ $rc = 1 ] && grep -q "did not finish within 2 s" spin.err; then
  lab_pass timeout "$(head -1 spin.err)"
else
  lab_fail timeout "rc=$rc $(tr '\n' ' ' < spin.err)"
fi
