# lab-about: slow; in cargo test on the 6.1 leg, in its L2 boot after l2ovmf (lab::libvirt_6_1): the "Booted" proof through libvirt: `gpupass xml domain` in L1, libvirt's QEMU driver on the host turns it into a QEMU command line (virsh domxml-to-native), and the L2 Linux booted from that line under OVMF assigns the 16 GiB BAR in the window gpupass set. L2 under TCG (minutes)
# lab-needs: gpupass
# lab-carry: qemu kernel libvirt
# lab-modules: 9pnet_virtio
# lab-modules: 9p
# lab-timeout: 1500
# lab-steps: qemu-version l2-kernel bind bind-driver big-bind big-bind-driver
# lab-steps: qemu-args sized-window
# lab-steps: virt-xml virt-native virt-libvirt-window virt-libvirt-devices
# lab-steps: virt-boot virt-ids virt-bars virt-above-4g virt-window virt-iomem virt-lspci
# lab-steps: unbind restored big-unbind big-restored duration
#
# l2ovmf boots its L2 from `gpupass qemu-args`; users of libvirt boot from gpupass's domain
# XML, which reaches QEMU only through libvirt's QEMU driver. Here the XML is made live in L1
# (`gpupass xml domain ... --libvirt-version 9.0`, the two functions bound to vfio-pci, so
# managed='no'), and handed over virtio-9p to the host, where lab/tools/libvirtnative.py runs
# Debian 12's libvirt 9.0 on it (`virsh -c qemu:///session domxml-to-native qemu-argv`, as user
# nobody: it converts, it defines and starts nothing). The line libvirt printed comes back
# (virt.libvirt), with what had to change to run it in L1 (virt.adjust: the env prefix, -S,
# -no-shutdown, the session's secret, socket and firmware paths, the pty serial to a file,
# -accel tcg and -cpu qemu64,phys-bits=36 as l2ovmf's boots, the direct kernel boot) and the
# firmware libvirt chose (Debian's non-secure-boot OVMF_CODE_4M.fd with its VARS template;
# the secure-boot descriptors are masked, as a user disabling secure boot gets: L2 boots an
# unsigned kernel directly). The machine, memory, root ports, vfio-pci devices, the 64-bit
# window (-global q35-pcihost.pci-hole64-size) and OVMF's aperture (-fw_cfg X-PciMmio64Mb)
# are libvirt's, as printed; the judges read the L2 kernel's own view, as in l2ovmf.

. /lab/l2/lib.sh

T0=$(cs)
lab_check qemu-version $Q --version
# Steps l2-kernel, bind, bind-driver, big-bind, big-bind-driver, qemu-args, sized-window;
# sets orig and big_orig (lab/guest/l2lib.sh).
l2_prepare

lab_run virt-xml virt.xml gpupass xml domain --name l2virt --memory 256M --vcpus 1 \
  --memtune off --libvirt-version 9.0 --device $D $BIG

# ---- the host's libvirt turns it into a QEMU command line
LV=/lab/libvirt
mkdir -p $LV
grep -q " $LV " /proc/mounts || mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 libvirt $LV
rm -f $LV/virt.*
cp virt.xml $LV/virt.xml
: > $LV/virt.req
t=0
while [ ! -e $LV/virt.done ] && [ ! -e $LV/virt.err ] && [ $t -lt 600 ]; do
  sleep 1
  t=$((t + 1))
done
if [ -e $LV/virt.done ]; then
  for f in libvirt argv adjust; do cp $LV/virt.$f virt.$f; lab_file virt.$f virt.$f; done
  lab_pass virt-native "$(head -1 virt.adjust) after ${t} s: $(wc -w < virt.libvirt) words; $(($(wc -l < virt.adjust) - 1)) adjustments for L1 (virt.adjust)"
else
  lab_fail virt-native "no answer from the host's libvirt after ${t} s: $(cat $LV/virt.err 2>/dev/null)"
fi
# libvirt carried gpupass's window and aperture into its command line: 32G = 33554432K
# (one word a line: libvirt prints the whole command on one line, and busybox's grep -o
# reports one pattern's matches per line).
lab_expect virt-libvirt-window "q35-pcihost.pci-hole64-size=33554432K name=opt/ovmf/X-PciMmio64Mb,string=32768" \
  "$(tr ' ' '\n' < virt.libvirt 2>/dev/null | grep -o -e 'q35-pcihost.pci-hole64-size=[0-9A-Z]*' -e 'name=opt/ovmf/X-PciMmio64Mb,string=[0-9]*' | tr '\n' ' ' | sed 's/ $//')"
n=$(grep -o '"driver":"vfio-pci","host":"[^"]*"' virt.libvirt 2>/dev/null | tr '\n' ' ')
if grep -q "\"driver\":\"vfio-pci\",\"host\":\"$D\"" virt.libvirt 2>/dev/null &&
  grep -q "\"driver\":\"vfio-pci\",\"host\":\"$BIG\"" virt.libvirt; then
  lab_pass virt-libvirt-devices "$n"
else
  lab_fail virt-libvirt-devices "want vfio-pci for $D and $BIG, got '$n'"
fi

# ---- the L2 Linux booted from libvirt's line
set --
if [ -s virt.argv ]; then
  while IFS= read -r a; do set -- "$@" "$a"; done < virt.argv
fi
if [ $# -gt 0 ]; then
  boot_l2_cmd virt 1200 "$@"
else
  L2_RC=none L2_SECS=0
fi
booted virt- virt.txt
listed virt- virt.txt
assigned virt- virt.txt
above4g virt- virt.txt
inwindow virt- virt.txt $((32 << 30))
iomem virt- virt.txt
lspcivv virt- virt.txt

# ---- everything back as it was
lab_run unbind unbind.txt gpupass unbind $D
lab_expect restored "$orig" "$(lab_driver $D)"
lab_run big-unbind big-unbind.txt gpupass unbind $BIG
lab_expect big-restored "$big_orig" "$(lab_driver $BIG)"
lab_pass duration "scenario took $(secs $(($(cs) - T0))) s"
