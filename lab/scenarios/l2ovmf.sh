# lab-about: slow; in cargo test on the 6.1 leg, in its L2 boot after l2linux (lab::ovmf_6_1): the "Booted" proof under OVMF: an L2 Linux started from `gpupass qemu-args` assigns the 16 GiB BAR in gpupass's window; with `--pci-hole64 8G` OVMF and the L2 kernel leave it unassigned. L2 under TCG (minutes per boot)
# lab-needs: gpupass
# lab-carry: qemu ovmf kernel
# lab-timeout: 2460
# lab-steps: qemu-version ovmf-firmware l2-kernel bind bind-driver big-bind big-bind-driver
# lab-steps: qemu-args sized-window
# lab-steps: ovmf-boot ovmf-ids ovmf-bars ovmf-above-4g ovmf-window
# lab-steps: small-qemu-args small-boot small-ids small-other-bars small-window small-unassigned small-kmsg
# lab-steps: unbind restored big-unbind big-restored duration
#
# l2linux's L2 Linux with Debian 12's OVMF 2022.11 (/opt/ovmf/OVMF.fd) instead of SeaBIOS, two
# boots, each with `gpupass qemu-args 0000:00:03.0 0000:00:0c.0` output as is, and an L2 CPU
# of phys-bits=36: below 40 bits OVMF uses its classic 64-bit aperture, which X-PciMmio64Mb
# sets (at 40 bits and more it sizes a dynamic one and ignores the file; docs/vm-outputs.md):
#
#   ovmf   gpupass's window (32G for the 16 GiB BAR): every BAR placed, BAR2 above 4 GiB.
#   small  `--pci-hole64 8G`: QEMU's window and OVMF's aperture smaller than the 16 GiB BAR,
#          the case gpupass's default prevents (an H100's 128 GiB BAR1 against QEMU's and
#          OVMF's default 32 GiB): the BAR must stay unassigned, by the firmware and by the
#          L2 kernel, which finds no window to place it in either.
#
# Both boots run with -accel tcg: under nested KVM the host's QEMU 10.0.2 (TCG) aborts within
# seconds of OVMF's start (`tcg_handle_interrupt: assertion failed: (bql_locked())`: OVMF's
# interrupt return path writes CR8, and QEMU's CR8 write in SVM guest mode raises the
# virtual interrupt without the lock), which ends the whole lab boot. TCG inside TCG runs the
# same firmware, kernel and VFIO devices, but takes minutes per boot. docs/lab.md has the
# timings.

. /lab/l2/lib.sh

T0=$(cs)
lab_check qemu-version $Q --version
if [ -s $OVMF ]; then lab_pass ovmf-firmware "$OVMF $(wc -c < $OVMF) bytes md5 $(md5sum < $OVMF | cut -d' ' -f1)"; else lab_fail ovmf-firmware "no $OVMF"; fi
# Steps l2-kernel, bind, bind-driver, big-bind, big-bind-driver, qemu-args, sized-window;
# sets orig and big_orig (lab/guest/l2lib.sh).
l2_prepare

# ---- 1. OVMF, gpupass's window
# shellcheck disable=SC2046
boot_l2 ovmf tcg 1200 -bios $OVMF -cpu qemu64,phys-bits=36 $(cat qemu-args.txt)
booted ovmf- ovmf.txt
listed ovmf- ovmf.txt
assigned ovmf- ovmf.txt
above4g ovmf- ovmf.txt
inwindow ovmf- ovmf.txt $((32 << 30))

# ---- 2. OVMF, a window smaller than the BAR: the failure gpupass's sizing prevents
# --cpu none: the L2 keeps its own CPU (TCG has no `host` model; under the lab's nested KVM
# `host` would be L1's emulated CPU), so the arguments carry no -cpu, as before; --qemu $Q:
# --backend auto asks that QEMU's version (10.0) before it emits iommufd.
lab_run small-qemu-args small-qemu-args.txt gpupass qemu-args --cpu none --qemu $Q $D $BIG --pci-hole64 8G
# shellcheck disable=SC2046
boot_l2 small tcg 1200 -bios $OVMF -cpu qemu64,phys-bits=36 $(cat small-qemu-args.txt)
booted small- small.txt
listed small- small.txt
# the other function is unaffected: all its BARs placed, at L1's sizes
got=$(l2_bars "${L2D:-none}" small.txt)
un=$(l2_unassigned "${L2D:-none}" small.txt)
if [ -n "$L2D" ] && [ "$got" = "$(l1_bars $D)" ] && [ -z "$un" ]; then
  lab_pass small-other-bars "$L2D sizes $got; BAR0 $(l2_res "$L2D" 0 small.txt | cut -d' ' -f1)"
else
  lab_fail small-other-bars "$L2D sizes '$got' (L1: '$(l1_bars $D)'), unassigned '$un'"
fi
w=$(root_window 0 small.txt)
if [ -n "$w" ] && [ $((${w#* } - ${w% *} + 1)) -eq $((8 << 30)) ]; then
  lab_pass small-window "64-bit root bus window [${w% *}-${w#* }] (8 GiB, what --pci-hole64 8G set), smaller than the 16 GiB BAR"
else
  lab_fail small-window "want an 8 GiB 64-bit root bus window, got '$w': $(grep 'root bus resource' small.txt | tr '\n' ';')"
fi
r=$(l2_res "${L2BIG:-none}" 2 small.txt)
if [ -n "$L2BIG" ] && [ -n "$r" ] && [ $((${r%% *})) -eq 0 ]; then
  lab_pass small-unassigned "$L2BIG BAR2 [$(echo "$r" | cut -d' ' -f1-2)] has no address (flags $(echo "$r" | cut -d' ' -f3)); BARs without an address: $(l2_unassigned "$L2BIG" small.txt)"
else
  lab_fail small-unassigned "$L2BIG BAR2 is '$r': placed"
fi
m=$(grep "^L2-KMSG.*$L2BIG.*BAR 2.*\(no space\|failed to assign\)" small.txt | head -2 | sed 's/^L2-KMSG //' | tr '\n' ';')
if [ -n "$L2BIG" ] && [ -n "$m" ]; then lab_pass small-kmsg "$m"; else lab_fail small-kmsg "no 'no space'/'failed to assign' for $L2BIG BAR 2"; fi

# ---- 3. everything back as it was
lab_run unbind unbind.txt gpupass unbind $D
lab_expect restored "$orig" "$(lab_driver $D)"
lab_run big-unbind big-unbind.txt gpupass unbind $BIG
lab_expect big-restored "$big_orig" "$(lab_driver $BIG)"
lab_pass duration "scenario took $(secs $(($(cs) - T0))) s"
