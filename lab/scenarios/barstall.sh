# lab-about: measurement, not in the tests' boots: how long an L2 QEMU takes to start with a huge 64-bit BAR passed through (16 GiB 00:0c.0 and a 64 GiB ivshmem 00:0f.0), the BARs mmap'ed (QEMU's default, what `gpupass qemu-args` emits) against `x-no-mmap=on`; where the time goes (the QEMU threads' L1 kernel stacks)
# lab-needs: gpupass
# lab-carry: qemu
# lab-mem: 2048
# lab-timeout: 2400
# lab-qemu: -object memory-backend-file,id=lab-hugebar,mem-path=/var/tmp,size=64G,share=on
# lab-qemu: -device ivshmem-plain,memdev=lab-hugebar,bus=pcie.0,addr=0xf
# lab-steps: qemu-version dev-kvm huge-l1-bar bind bind-driver huge-bind huge-bind-driver
# lab-steps: big-mmap big-nommap huge-mmap huge-nommap unbind restored huge-unbind huge-restored duration
# lab-steps-6.12: big-iommufd huge-iommufd
#
# Users with 80-128 GiB BARs (H100/H200 BAR1) report VMs that take minutes to start: QEMU
# mmaps each BAR of the VFIO device and maps it into the IOMMU for peer-to-peer DMA when the
# guest firmware enables memory decoding, and the host kernel's vfio_iommu_type1 walks that
# PFNMAP range (docs/lab.md saw 18-25 s for the lab's 16 GiB BAR on 6.1). This scenario times
# it per BAR size and per mode on the leg's kernel, with the L2 firmware QEMU loads (SeaBIOS;
# no L2 kernel: the stall happens before any OS runs) under nested KVM:
#
#   mmap     `gpupass qemu-args` as printed: the BAR mmap'ed, mapped for P2P DMA;
#   nommap   the same plus `x-no-mmap=on` on the device: no mmap, no DMA map of the BAR, every
#            guest access to it trapped and forwarded by QEMU (unusable for a GPU's BAR1, but
#            the start without the stall).
#   iommufd  (6.12) `gpupass qemu-args --backend iommufd`: the BAR mmap'ed, but a kernel before
#            6.19 cannot map VFIO BAR memory into an iommufd IOAS, so QEMU skips the P2P map.
#
# Each L2 run is timed from QEMU's exec to the end of SeaBIOS's PCI setup (its debug console,
# "PCI: ... primary VGA" / "No VGA devices found"), then killed. When the firmware is quiet for
# 5 s, the QEMU threads' kernel stacks are kept (NAME.stall): the stall's place in L1's kernel.
# Results: docs/vm-outputs.md, "Huge BARs: the start-up stall". Run:
#   lab/lab.sh [--kernel 6.12] run barstall

Q=/opt/qemu/bin/qemu-system-x86_64
BIG=0000:00:0c.0     # ivshmem-plain: 16 GiB 64-bit prefetchable BAR2
HUGE=0000:00:0f.0    # ivshmem-plain: 64 GiB 64-bit prefetchable BAR2 (this scenario's lab-qemu)
LIMIT=900            # seconds one L2 start may take

cs() { read -r _u _ < /proc/uptime; echo "${_u%.*}${_u#*.}"; }
secs() { echo "$(($1 / 100)).$(printf '%02d' $(($1 % 100)))"; }
alive() { [ -d "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

# start NAME QEMU_ARGS...: an L2 QEMU under nested KVM with SeaBIOS until its PCI setup ends
# (or LIMIT s); sets START_S (s), START_OK (yes/no).
start() {
  local n=$1 t0 pid now quiet_at=0 lines seen=0 stacked=""
  shift
  rm -f "$n.log" "$n.stall"
  echo "\$ $Q -accel kvm -M q35 -m 128 ... $*"
  t0=$(cs)
  $Q -accel kvm -M q35 -m 128 -smp 1 -nodefaults -display none \
    -chardev "file,id=dbg,path=$n.log" -device isa-debugcon,iobase=0x402,chardev=dbg \
    "$@" > "$n.out" 2>&1 &
  pid=$!
  START_OK=no
  while alive $pid; do
    now=$(($(cs) - t0))
    if grep -qE '^PCI: (No VGA devices found|Using .* for primary VGA)' "$n.log" 2>/dev/null; then
      START_OK=yes
      break
    fi
    lines=$(wc -l 2>/dev/null < "$n.log" || echo 0)
    if [ "$lines" != "$seen" ]; then
      seen=$lines quiet_at=$now
    elif [ $((now - quiet_at)) -ge 500 ] && [ -z "$stacked" ]; then
      stacked=yes
      for t in /proc/$pid/task/*; do
        echo "== $(cat "$t/comm" 2>/dev/null) thread $(basename "$t"), $(secs $now) s, $lines lines of firmware output"
        cat "$t/stack" 2>/dev/null
      done > "$n.stall"
    fi
    [ $now -gt $((LIMIT * 100)) ] && break
    sleep 0.2
  done
  START_S=$(secs $(($(cs) - t0)))
  kill $pid 2>/dev/null; sleep 1; kill -9 $pid 2>/dev/null
  wait $pid 2>/dev/null
  [ -f "$n.log" ] && lab_file "$n.log" "$n.log"
  [ -s "$n.stall" ] && lab_file "$n.stall" "$n.stall"
  [ -s "$n.out" ] && lab_file "$n.out" "$n.out"
  return 0
}

# timed STEP NAME ADDR QEMU_ARGS...: one start, a step with its time and where it stalled.
timed() {
  local step=$1 n=$2 a=$3 where=""
  shift 3
  start "$n" "$@"
  [ -s "$n.stall" ] && where="; stalled in: $(grep -m1 -oE 'vfio_[a-z_]+|iommu_[a-z_]+|follow_[a-z_]+' "$n.stall" | head -1)"
  if [ "$START_OK" = yes ]; then
    lab_pass "$step" "$START_S s to the end of SeaBIOS's PCI setup, $a BAR2 $(bar2 "$a")$where"
  else
    lab_fail "$step" "no end of PCI setup after $START_S s$where; $(tail -2 "$n.out" | tr '\n' ' ')"
  fi
  echo "$step $START_S" >> times.txt
}
bar2() { set -- $(sed -n 3p "/sys/bus/pci/devices/$1/resource"); echo "$((($2 - $1 + 1) >> 30)) GiB"; }

T0=$(cs)
: > times.txt
lab_check qemu-version $Q --version
lab_check dev-kvm test -c /dev/kvm
if [ "$(bar2 $HUGE)" = "64 GiB" ]; then
  lab_pass huge-l1-bar "$HUGE BAR2 $(sed -n 3p /sys/bus/pci/devices/$HUGE/resource)"
else
  lab_fail huge-l1-bar "$HUGE BAR2: '$(sed -n 3p /sys/bus/pci/devices/$HUGE/resource 2>&1)'"
fi
orig=$(lab_driver $BIG) horig=$(lab_driver $HUGE)
lab_run bind bind.txt gpupass bind $BIG
lab_expect bind-driver vfio-pci "$(lab_driver $BIG)"
lab_run huge-bind huge-bind.txt gpupass bind $HUGE
lab_expect huge-bind-driver vfio-pci "$(lab_driver $HUGE)"
# --cpu none: the L2 keeps QEMU's default CPU (as nested does); --backend legacy: one backend
# on both legs, so the legs differ only by their kernel's type1; iommufd is timed on 6.12 after.
gpupass qemu-args --cpu none --backend legacy $BIG > big-args.txt
gpupass qemu-args --cpu none --backend legacy $HUGE > huge-args.txt
lab_file big-args.txt big-args.txt
lab_file huge-args.txt huge-args.txt
# shellcheck disable=SC2046  # one "-device VALUE" per line, nothing quoted in gpupass's output
timed big-mmap big-mmap $BIG $(cat big-args.txt)
# shellcheck disable=SC2046
timed big-nommap big-nommap $BIG $(sed "s/^\(-device vfio-pci,.*\)$/\1,x-no-mmap=on/" big-args.txt)
# shellcheck disable=SC2046
timed huge-mmap huge-mmap $HUGE $(cat huge-args.txt)
# shellcheck disable=SC2046
timed huge-nommap huge-nommap $HUGE $(sed "s/^\(-device vfio-pci,.*\)$/\1,x-no-mmap=on/" huge-args.txt)
if [ "$LAB_KERNEL" = 6.12 ]; then
  gpupass qemu-args --cpu none --qemu $Q --backend iommufd $BIG > big-iommufd-args.txt
  gpupass qemu-args --cpu none --qemu $Q --backend iommufd $HUGE > huge-iommufd-args.txt
  lab_file big-iommufd-args.txt big-iommufd-args.txt
  lab_file huge-iommufd-args.txt huge-iommufd-args.txt
  # shellcheck disable=SC2046
  timed big-iommufd big-iommufd $BIG $(cat big-iommufd-args.txt)
  # shellcheck disable=SC2046
  timed huge-iommufd huge-iommufd $HUGE $(cat huge-iommufd-args.txt)
fi
lab_file times.txt times.txt

lab_run unbind unbind.txt gpupass unbind $BIG
lab_expect restored "$orig" "$(lab_driver $BIG)"
lab_run huge-unbind huge-unbind.txt gpupass unbind $HUGE
lab_expect huge-restored "$horig" "$(lab_driver $HUGE)"
lab_pass duration "scenario took $(secs $(($(cs) - T0))) s"
