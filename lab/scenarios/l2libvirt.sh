# lab-about: slow; in cargo test on the 6.1 leg, in its L2 boot after l2huge (lab::libvirt_6_1): the "Booted" proof through libvirt: `gpupass xml domain` in L1, libvirt's QEMU driver on the host turns it into a QEMU command line (virsh domxml-to-native), and the L2 Linux booted from that line under OVMF assigns a 64 GiB BAR (larger than QEMU's and OVMF's defaults, which l2huge shows failing) in the 128 GiB window gpupass set. L2 under TCG (minutes)
# lab-needs: gpupass
# lab-carry: qemu kernel libvirt
# lab-modules: 9pnet_virtio
# lab-modules: 9p
# lab-timeout: 1500
# lab-qemu: -object memory-backend-file,id=lab-hugebar,mem-path=/var/tmp,size=64G,share=on
# lab-qemu: -device ivshmem-plain,memdev=lab-hugebar,bus=pcie.0,addr=0xf
# lab-steps: qemu-version huge-l1-bar big-marker l2-kernel bind bind-driver big-bind big-bind-driver
# lab-steps: qemu-args sized-window
# lab-steps: virt-xml virt-native virt-libvirt-window virt-libvirt-devices
# lab-steps: virt-boot virt-ids virt-bars virt-above-4g virt-window virt-iomem virt-lspci virt-reads
# lab-steps: unbind restored big-unbind big-restored duration
#
# l2huge boots its L2 from `gpupass qemu-args`; users of libvirt boot from gpupass's domain
# XML, which reaches QEMU only through libvirt's QEMU driver. Here the XML is made live in L1
# (`gpupass xml domain ... --libvirt-version 9.0` for bochs-display 00:03.0 and the 64 GiB
# ivshmem 00:0f.0 of l2huge, both bound to vfio-pci, so managed='no'), and handed over
# virtio-9p to the host, where lab/tools/libvirtnative.py runs Debian 12's libvirt 9.0 on it
# (`virsh -c qemu:///session domxml-to-native qemu-argv`, as user nobody: it converts, it
# defines and starts nothing). The line libvirt printed comes back (virt.libvirt), with what
# had to change to run it in L1 (virt.adjust: the env prefix, -S, -no-shutdown, the session's
# secret, socket and firmware paths, the pty serial to a file, -accel tcg and -cpu
# qemu64,phys-bits=39 as l2huge's boots, x-no-mmap on 00:0f.0, the direct kernel boot) and the
# firmware libvirt chose (Debian's non-secure-boot OVMF_CODE_4M.fd with its VARS template; the
# secure-boot descriptors are masked, as a user disabling secure boot gets: L2 boots an
# unsigned kernel directly). The machine, memory, root ports, vfio-pci devices, the 64-bit
# window (-global q35-pcihost.pci-hole64-size) and OVMF's aperture (-fw_cfg X-PciMmio64Mb)
# are libvirt's, as printed; the judges read the L2 kernel's own view, as in l2huge.
#
# x-no-mmap: libvirt 9.0 emits only the legacy container, whose peer-to-peer map of the
# mmap'ed BAR walks all 64 GiB page by page each time OVMF turns decoding on (barstall), so
# the BAR is trapped instead; where OVMF and the L2 kernel place it does not depend on that,
# and the L2 kernel still reads L1's marker through it (virt-reads). Until 2026-12-05 this
# scenario passed the 16 GiB BAR (00:0c.0) mapped, in a 32 GiB window (docs/lab.md).

. /lab/l2/lib.sh

BIG=$HUGE WIN_G=128
T0=$(cs)
lab_check qemu-version $Q --version
huge_l1_bar
MARK=0x4855474d
big_marker $MARK
# Steps l2-kernel, bind, bind-driver, big-bind, big-bind-driver, qemu-args, sized-window;
# sets orig and big_orig (lab/guest/l2lib.sh).
l2_prepare

# native NAME STEP: the host's libvirt turns NAME.xml (and NAME.opts) into a QEMU command line:
# NAME.libvirt, NAME.argv, NAME.adjust (lab/tools/libvirtnative.py); step STEP judges the answer.
LV=/lab/libvirt
mkdir -p $LV
grep -q " $LV " /proc/mounts || mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 libvirt $LV
native() {
  local n=$1 t=0 f
  rm -f $LV/$n.*
  cp $n.xml $LV/$n.xml
  if [ -e $n.opts ]; then cp $n.opts $LV/$n.opts; fi
  : > $LV/$n.req
  while [ ! -e $LV/$n.done ] && [ ! -e $LV/$n.err ] && [ $t -lt 600 ]; do
    sleep 1
    t=$((t + 1))
  done
  if [ -e $LV/$n.done ]; then
    for f in libvirt argv adjust; do cp $LV/$n.$f $n.$f; lab_file $n.$f $n.$f; done
    lab_pass "$2" "$(head -1 $n.adjust) after ${t} s: $(wc -w < $n.libvirt) words; $(($(wc -l < $n.adjust) - 1)) adjustments for L1 ($n.adjust)"
  else
    lab_fail "$2" "no answer from the host's libvirt after ${t} s: $(cat $LV/$n.err 2>/dev/null)"
  fi
}
# window_of NAME: libvirt's window and aperture words (one word a line: libvirt prints the whole
# command on one line, and busybox's grep -o reports one pattern's matches per line).
window_of() {
  tr ' ' '\n' < "$1.libvirt" 2>/dev/null | grep -o -e 'q35-pcihost.pci-hole64-size=[0-9A-Z]*' -e 'name=opt/ovmf/X-PciMmio64Mb,string=[0-9]*' | tr '\n' ' ' | sed 's/ $//'
}
# devices_of NAME STEP: libvirt's line has a vfio-pci device for $D and for $BIG.
devices_of() {
  local n
  n=$(grep -o '"driver":"vfio-pci","host":"[^"]*"' "$1.libvirt" 2>/dev/null | tr '\n' ' ')
  if grep -q "\"driver\":\"vfio-pci\",\"host\":\"$D\"" "$1.libvirt" 2>/dev/null &&
    grep -q "\"driver\":\"vfio-pci\",\"host\":\"$BIG\"" "$1.libvirt"; then
    lab_pass "$2" "$n"
  else
    lab_fail "$2" "want vfio-pci for $D and $BIG, got '$n'"
  fi
}
# boot_argv NAME: boot the L2 from NAME.argv (libvirt's line as adjusted).
boot_argv() {
  local name=$1 a
  set --
  if [ -s "$name.argv" ]; then
    while IFS= read -r a; do set -- "$@" "$a"; done < "$name.argv"
  fi
  if [ $# -gt 0 ]; then
    boot_l2_cmd "$name" 1200 "$@"
  else
    L2_RC=none L2_SECS=0
  fi
}

lab_run virt-xml virt.xml gpupass xml domain --name l2virt --memory 256M --vcpus 1 \
  --memtune off --libvirt-version 9.0 --device $D $BIG
printf 'cpu=qemu64,phys-bits=39\nnommap=%s\n' $BIG > virt.opts
native virt virt-native
# libvirt carried gpupass's window and aperture into its command line: 128G = 134217728K.
lab_expect virt-libvirt-window "q35-pcihost.pci-hole64-size=134217728K name=opt/ovmf/X-PciMmio64Mb,string=131072" "$(window_of virt)"
devices_of virt virt-libvirt-devices

# ---- the L2 Linux booted from libvirt's line
boot_argv virt
judged virt- virt.txt $MARK

# ---- everything back as it was
l2_finish
