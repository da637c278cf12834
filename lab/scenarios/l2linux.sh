# lab-about: the "Booted" proof: an L2 Linux (the leg's own kernel, SeaBIOS, L2 under TCG) started from `gpupass qemu-args` lists the passed-through 00:03.0 and 16 GiB-BAR 00:0c.0 with every BAR assigned, the big one above 4 GiB inside the 64-bit window gpupass sized
# lab-needs: gpupass
# lab-carry: qemu kernel
# lab-timeout: 2120
# lab-steps: qemu-version big-marker l2-kernel bind bind-driver big-bind big-bind-driver
# lab-steps: qemu-args sized-window
# lab-steps: seabios-boot seabios-ids seabios-bars seabios-above-4g seabios-window
# lab-steps: seabios-iomem seabios-lspci seabios-reads
# lab-steps: unbind restored big-unbind big-restored duration
#
# nested.sh stops at the L2 firmware; this scenario boots Linux in L2: the L1 kernel's own
# image (/lab/l2/bzImage, carried by lab.sh: Debian's vmlinuz on 6.1, build.sh's bzImage on
# 6.12) with a busybox initrd whose /init (lab/guest/l2init) prints every PCI function's sysfs
# `resource` lines and the kernel's PCI resource messages on the L2 console, then powers off.
# One L2 boot with `gpupass qemu-args 0000:00:03.0 0000:00:0c.0` output as is, and QEMU's
# default firmware, SeaBIOS. The L2 runs under TCG, not nested KVM: under nested KVM the host's
# QEMU 10.0.2 (TCG, running L1) now and then stops delivering L1's interrupts while L2 runs
# (L1 halted at `sti; hlt` with its LAPIC timer vector pending and deliverable, for good: 2 of
# 6 runs on 2026-12-04; docs/lab.md, "The L2 hang: L1's lost interrupt"). Without nested SVM
# there is no such state to lose; VFIO, the IOMMU and the BARs are the same. SeaBIOS sizes its
# own 64-bit window and always places the 16 GiB BAR, so this is the positive case only; the failure gpupass's window
# prevents needs OVMF, which l2ovmf runs (slow: OVMF cannot run under nested KVM here).
# docs/lab.md ("l2linux, l2ovmf") has the details and the timings.

. /lab/l2/lib.sh

T0=$(cs)
lab_check qemu-version $Q --version
# A marker at the start of the big BAR, for the L2 kernel to read back (seabios-reads).
MARK=0x4c324232
big_marker $MARK
# Steps l2-kernel, bind, bind-driver, big-bind, big-bind-driver, qemu-args, sized-window;
# sets orig and big_orig (lab/guest/l2lib.sh).
l2_prepare

# ---- 1. SeaBIOS
# shellcheck disable=SC2046  # one "-device VALUE" per line, nothing quoted in gpupass's output
# 2000 s: L2 under TCG inside L1 under TCG ran 377 s on an otherwise idle 6.12 run (the L2
# kernel at /init after 213 s of its uptime), 918 s (6.1) and 1170 s (6.12) in cargo test's
# five lab boots with two more lab boots beside them (docs/testing.md); its timeline
# (seabios.timeline) says where the time went.
boot_l2 seabios tcg 2000 $(cat qemu-args.txt)
judged seabios- seabios.txt $MARK

# ---- 2. everything back as it was
l2_finish
