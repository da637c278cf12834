# lab-about: slow; by hand (in cargo test on the 6.1 leg from 2026-12-05 until l2huge replaced it): the "Booted" proof under OVMF: an L2 Linux started from `gpupass qemu-args` assigns the 16 GiB BAR in gpupass's window (the failing half, a BAR larger than the defaults, is l2huge's). L2 under TCG (minutes)
# lab-needs: gpupass
# lab-carry: qemu ovmf kernel
# lab-timeout: 1500
# lab-steps: qemu-version ovmf-firmware l2-kernel bind bind-driver big-bind big-bind-driver
# lab-steps: qemu-args sized-window
# lab-steps: ovmf-boot ovmf-ids ovmf-bars ovmf-above-4g ovmf-window
# lab-steps: unbind restored big-unbind big-restored duration
#
# l2linux's L2 Linux with Debian 12's OVMF 2022.11 (/opt/ovmf/OVMF.fd) instead of SeaBIOS, booted
# from `gpupass qemu-args 0000:00:03.0 0000:00:0c.0` output as is, and an L2 CPU of
# phys-bits=36: below 40 bits OVMF uses its classic 64-bit aperture, which X-PciMmio64Mb sets
# (at 40 bits and more it sizes a dynamic one and ignores the file; docs/vm-outputs.md).
# gpupass's window (32G for the 16 GiB BAR): every BAR placed, BAR2 above 4 GiB.
#
# Until 2026-12-05 a second boot here (`small`, `--pci-hole64 8G`) showed a window smaller
# than the BAR leaving it unassigned. The 16 GiB BAR fits QEMU's and OVMF's default 32 GiB, so
# that case needed a smaller window than the defaults; l2huge (6.12) now shows the field's case
# instead, a 64 GiB BAR with the defaults, and l2libvirt its success through libvirt.
#
# The boot runs with -accel tcg: under nested KVM the host's QEMU 10.0.2 (TCG) aborts within
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

# ---- 2. everything back as it was
l2_finish
