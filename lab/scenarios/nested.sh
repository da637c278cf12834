# lab-about: QEMU 10.0 inside the guest: L2 VMs (-accel kvm, nested SVM) with VFIO devices from `gpupass qemu-args`; L2's SeaBIOS sees their IDs and BARs (the 16 GiB one too)
# lab-needs: gpupass
# lab-carry: qemu
# lab-timeout: 420
# lab-steps: qemu-version dev-kvm bind bind-driver qemu-args l2-exit l2-kvm l2-start
# lab-steps: l2-ids l2-bars big-bind big-bind-driver big-qemu-args big-l1-bars big-exit
# lab-steps: big-start big-ids big-bars big-above-4g big-window big-sized-window big-hole64-exit big-hole64-bars
# lab-steps: big-hole64-window unbind restored big-unbind big-restored duration qemu-args-backend
# lab-steps-6.12: launch-args launch-exit launch-ids launch-bars launch-nodes launch-exec-error
# lab-steps-6.1: launch-refused
#
# The L2 guest is the firmware QEMU loads (SeaBIOS 1.16.3): booting a Linux kernel in L2 under
# nested SVM inside TCG is too slow for a smoke test, while SeaBIOS enumerates PCI, sizes and
# places every BAR and logs it on its debug console (isa-debugcon, port 0x402) in seconds.
# Once its PCI setup is over, QMP reads the 64-bit PCI window QEMU derives from what the firmware
# programmed (the window an L2 OS is given in ACPI) and quits: the rest of the firmware's boot
# (disk probes, option ROMs) would cost 20-35 s more under TCG and shows nothing about the device.
# Should the firmware get to its end first, it resets at once (`-boot reboot-timeout=0`) and
# `-action reboot=shutdown,shutdown=pause` keeps QEMU paused for the query. docs/lab.md has the
# timings.

Q=/opt/qemu/bin/qemu-system-x86_64
D=0000:00:03.0       # bochs-display: 16 MiB prefetchable BAR0, 4 KiB BAR2, 32 KiB ROM
BIG=0000:00:0c.0     # ivshmem-plain: 256 B BAR0, 16 GiB 64-bit prefetchable BAR2
L2_LIMIT=240         # seconds one L2 run may take before it is killed (the 16 GiB BAR: 30-75 s)

# uptime in centiseconds; centiseconds as seconds
cs() { read -r _u _ < /proc/uptime; echo "${_u%.*}${_u#*.}"; }
secs() { echo "$(($1 / 100)).$(printf '%02d' $(($1 % 100)))"; }
alive() { [ -d "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }

# l1_bars ADDR [raw]: "bar size" (hex) per non-empty BAR of the L1 sysfs `resource` file (line 6
# is the ROM, SeaBIOS's bar 6). Without `raw`, the size SeaBIOS allocates: memory BARs below
# 4 KiB get a whole page (PCI_DEVICE_MEM_MIN in its pciinit.c), I/O BARs their own size.
l1_bars() {
  _i=0
  while read -r _s _e _f; do
    [ $_i -gt 6 ] && break
    if [ $((_e)) -ne 0 ]; then
      _z=$((_e - _s + 1))
      [ -z "$2" ] && [ $((_f & 0x100)) -eq 0 ] && [ $_z -lt 4096 ] && _z=4096
      printf '%d %x\n' $_i $_z
    fi
    _i=$((_i + 1))
  done < "/sys/bus/pci/devices/$1/resource"
}
# l2_bars BDF LOG: "bar size" from SeaBIOS's "PCI: map device bdf=B  bar N, addr A, size S" lines.
l2_bars() {
  sed -n "s/^PCI: map device bdf=$1  *bar \([0-9]*\), addr [0-9a-f]*, size \([0-9a-f]*\).*/\1 \2/p" "$2" |
    while read -r _b _s; do printf '%d %x\n' "$_b" $((0x$_s)); done | sort -n
}
# l2_addr BDF BAR LOG: the address SeaBIOS gave that BAR (hex, no 0x).
l2_addr() { sed -n "s/^PCI: map device bdf=$1  *bar $2, addr \([0-9a-f]*\),.*/\1/p" "$3" | head -1; }
# l2_bdf IDS LOG: the bdf SeaBIOS gave the function with vendor:device IDS.
l2_bdf() { sed -n "s/^PCI: init bdf=\([0-9a-f:.]*\) id=$1\$/\1/p" "$2" | head -1; }
ids() { echo "$(sed 's/^0x//' "/sys/bus/pci/devices/$1/vendor"):$(sed 's/^0x//' "/sys/bus/pci/devices/$1/device")"; }

# l2_run NAME IDS QEMU_ARGS...: start an L2 VM, wait until its firmware has set up PCI and
# initialised the function IDS (or kill it after L2_LIMIT s), read the 64-bit window over QMP,
# quit. Sets L2_RC, L2_FIRST (s to the first firmware output: QEMU's own start), L2_ENUM (s to
# the end of the firmware's PCI setup), L2_TOTAL (s to QEMU's exit), L2_HOLE64_START and
# L2_HOLE64_END (decimal).
l2_run() {
  local n=$1 want=$2 t0 pid now first="" enum="" lines seen_lines=0 seen_at=0 stacks="" phase t
  shift 2
  # QMP: commands through the fifo qmp.in, replies into the plain file qmp.out (QEMU's pipe
  # chardev opens both read-write, so nothing here ever blocks on a fifo).
  rm -f "$n.log" "$n.timeline" "$n.stall" qmp.in qmp.out
  mkfifo qmp.in && : > qmp.out
  echo "\$ $Q -accel kvm -M q35 -m 128 ... $*"
  t0=$(cs)
  $Q -accel kvm -M q35 -m 128 -smp 1 -nodefaults -display none \
    -boot reboot-timeout=0 -action reboot=shutdown,shutdown=pause \
    -chardev "file,id=dbg,path=$n.log" -device isa-debugcon,iobase=0x402,chardev=dbg \
    -chardev pipe,id=qmp,path=qmp -mon chardev=qmp,mode=control \
    "$@" > "$n.out" 2>&1 &
  pid=$!
  while alive $pid; do
    now=$(($(cs) - t0))
    [ -z "$first" ] && [ -s "$n.log" ] && first=$now
    # NAME.timeline: when each new stretch of firmware output showed up (0.2 s resolution)
    lines=$(wc -l 2>/dev/null < "$n.log" || echo 0)
    phase=start; [ -n "$first" ] && phase=run
    if [ "$lines" != "$seen_lines" ]; then
      echo "$(secs $now) $lines $(tail -1 "$n.log")" >> "$n.timeline"; seen_lines=$lines seen_at=$now
    elif [ $((now - seen_at)) -ge 300 ] && [ "$stacks" != "$phase" ] && [ "$stacks" != run ]; then
      # no firmware output for 3 s: where QEMU's threads are in the L1 kernel (NAME.stall),
      # once before the first output and once after it
      stacks=$phase
      for t in /proc/$pid/task/*; do
        echo "== $(cat "$t/comm" 2>/dev/null) thread $(basename "$t"), $(secs $now) s, $lines lines of output"
        cat "$t/stack" 2>/dev/null
      done >> "$n.stall"
    fi
    # pci_setup() ends with the primary-VGA line, after every "PCI: init" line
    if grep -q "^PCI: init bdf=.* id=$want\$" "$n.log" 2>/dev/null &&
      grep -qE '^PCI: (No VGA devices found|Using .* for primary VGA)' "$n.log"; then
      enum=$now; break
    fi
    if [ $now -gt $((L2_LIMIT * 100)) ]; then
      echo "L2 $n: no PCI setup with $want after $L2_LIMIT s, killing QEMU" >> "$n.out"
      break
    fi
    sleep 0.2
  done
  if [ -n "$enum" ]; then
    { echo '{"execute":"qmp_capabilities"}'
      for p in pci-hole64-start pci-hole64-end; do
        echo '{"execute":"qom-get","arguments":{"path":"/machine/q35","property":"'$p'"}}'
      done
      echo '{"execute":"query-status"}'
      echo '{"execute":"quit"}'; } 1<> qmp.in
  fi
  # QEMU quits on its own after `quit`; one that does not within 20 s is killed.
  now=0
  while alive $pid && [ $now -lt 100 ]; do sleep 0.2; now=$((now + 1)); done
  alive $pid && { kill $pid; sleep 1; kill -9 $pid 2>/dev/null; }
  wait $pid
  L2_RC=$?
  L2_TOTAL=$(secs $(($(cs) - t0)))
  mv qmp.out "$n.qmp"; rm -f qmp.in
  L2_FIRST=$(secs "${first:-0}") L2_ENUM=$(secs "${enum:-0}")
  L2_HOLE64_START=$(grep '"return": [0-9]' "$n.qmp" | sed -n '1s/.*: \([0-9]*\)}.*/\1/p')
  L2_HOLE64_END=$(grep '"return": [0-9]' "$n.qmp" | sed -n '2s/.*: \([0-9]*\)}.*/\1/p')
  cat "$n.out"
  [ -f "$n.log" ] && lab_file "$n.log" "$n.log"
  [ -s "$n.qmp" ] && lab_file "$n.qmp" "$n.qmp"
  [ -s "$n.timeline" ] && lab_file "$n.timeline" "$n.timeline"
  [ -s "$n.stall" ] && lab_file "$n.stall" "$n.stall"
  [ -s "$n.out" ] && lab_file "$n.out" "$n.out"
  return 0
}

# seen PREFIX ADDR LOG: the L2 firmware enumerated L1's ADDR with its IDs behind the root port
# gpupass declared (rp1, the only bridge: bus 01), with every BAR at the L1 size.
seen() {
  local p=$1 a=$2 log=$3 id bdf
  id=$(ids "$a")
  bdf=$(l2_bdf "$id" "$log")
  lab_expect "${p}ids" "01:00.0 $id" "$bdf $id"
  lab_expect "${p}bars" "$(l1_bars "$a" | tr '\n' ' ')" "$(l2_bars "${bdf:-none}" "$log" | tr '\n' ' ')"
}

# window PREFIX LOG: the 16 GiB BAR lies inside the 64-bit window QEMU reports (QMP).
window() {
  local p=$1 log=$2 a s e bits note=''
  a=$(l2_addr 01:00.0 2 "$log")
  s=${L2_HOLE64_START:-0} e=${L2_HOLE64_END:-0}
  bits=$(sed -n 's/^physbits:.* phys-bits=\([0-9]*\).*/\1/p' "$log" | head -1)
  [ -n "$bits" ] && [ "$e" -gt $((1 << bits)) ] && note="; the window ends past the L2 CPU's phys-bits=$bits limit $(printf '0x%x' $((1 << bits)))"
  if [ -n "$a" ] && [ "$e" -gt 0 ] && [ $((0x$a)) -ge "$s" ] && [ $((0x$a + 0x400000000)) -le "$e" ]; then
    lab_pass "${p}window" "BAR2 0x$a+16G inside pci-hole64 [$(printf '0x%x' "$s"), $(printf '0x%x' "$e")) ($(((e - s) >> 30)) GiB), phys-bits=${bits:-?}$note"
  else
    lab_fail "${p}window" "BAR2 at '${a}' not inside pci-hole64 [${s}, ${e})"
  fi
}

T0=$(cs)
lab_check qemu-version $Q --version
lab_check dev-kvm test -c /dev/kvm

# ---- 1. bochs-display 00:03.0: bind, qemu-args, the L2 firmware enumerates it
orig=$(lab_driver $D)
lab_run bind bind.txt gpupass bind $D
lab_expect bind-driver vfio-pci "$(lab_driver $D)"
# --cpu none: the L2 keeps its own CPU (TCG has no `host` model; under the lab's nested KVM
# `host` would be L1's emulated CPU), so the arguments carry no -cpu, as before; --qemu $Q:
# --backend auto asks that QEMU's version (10.0) before it emits iommufd.
lab_run qemu-args qemu-args.txt gpupass qemu-args --cpu none --qemu $Q $D
# shellcheck disable=SC2046  # gpupass prints one "-device VALUE" per line, nothing quoted here
l2_run seabios "$(ids $D)" $(cat qemu-args.txt)
lab_expect l2-exit 0 "$L2_RC"
if grep -q '^Running on KVM' seabios.log; then lab_pass l2-kvm "$(grep -m1 '^cpuid 0x40000000' seabios.log)"; else lab_fail l2-kvm "SeaBIOS did not find KVM"; fi
if [ -n "$(l2_bdf "$(ids $D)" seabios.log)" ]; then
  lab_pass l2-start "first firmware output ${L2_FIRST} s, PCI set up ${L2_ENUM} s, QEMU gone ${L2_TOTAL} s"
else
  lab_fail l2-start "$(ids $D) not enumerated after ${L2_TOTAL} s: $(tail -2 seabios.log | tr '\n' ' ')"
fi
seen l2- $D seabios.log
# qemu-args' default backend (auto): iommufd on 6.12 (the L2 above opened the cdev), the group
# and container on 6.1.
if [ "$LAB_KERNEL" = 6.12 ]; then want="iommufd 1"; else want="legacy 0"; fi
got=$(grep -c 'iommufd=iommufd0' qemu-args.txt)
[ "$got" -gt 0 ] && got="iommufd $got" || got="legacy 0"
lab_expect qemu-args-backend "$want" "$got"

# ---- 1b. gpupass launch: root opens /dev/iommu and the cdev, QEMU inherits them and runs as
# nobody (65534), which could not open either node itself (both are 0600 root).
if [ "$LAB_KERNEL" = 6.12 ]; then
  cdev=$(ls /sys/bus/pci/devices/$D/vfio-dev | head -1)
  kvm_mode=$(stat -c %a /dev/kvm)
  chmod 666 /dev/kvm      # the L2 QEMU runs as nobody; KVM itself is not what is proved here
  chmod 777 .
  old_umask=$(umask); umask 000
  QEMU_AS_ROOT=$Q
  Q="gpupass launch --cpu none --device $D --user 65534:65534 --memlock 1G --print -- $QEMU_AS_ROOT"
  l2_run launch "$(ids $D)"
  Q=$QEMU_AS_ROOT
  umask "$old_umask"; chmod "$kvm_mode" /dev/kvm
  line=$(grep -m1 '^gpupass launch: ' launch.out)
  if echo "$line" | grep -q 'iommufd,id=iommufd0,fd=[0-9]' && echo "$line" | grep -q 'vfio-pci,fd=[0-9]*,id=hostdev1' && ! echo "$line" | grep -q 'host='; then
    lab_pass launch-args "${line#gpupass launch: }"
  else
    lab_fail launch-args "'$line' $(tail -3 launch.out | tr '\n' ' ')"
  fi
  lab_expect launch-exit 0 "$L2_RC"
  seen launch- $D launch.log
  # What the launched program is and holds: as nobody it cannot open either node itself, yet
  # fds 3 and 4 are /dev/iommu and the cdev (gpupass appends the device arguments, which sh -c
  # takes as its $0, $1, ...).
  gpupass launch --device $D --user 65534:65534 -- /bin/sh -c \
    'echo "uid=$(id -u) gid=$(id -g)"; cat /dev/iommu < /dev/null > /dev/null 2>&1 && echo own-open-ok || echo own-open-denied; readlink /proc/self/fd/3; readlink /proc/self/fd/4' \
    > launch-id.txt 2> launch-id.err
  want="uid=65534 gid=65534 own-open-denied /dev/iommu /dev/vfio/devices/$cdev"
  lab_expect launch-nodes "$want" "$(tr '\n' ' ' < launch-id.txt | sed 's/ $//')"
  lab_file launch-id.txt launch-id.txt
  # E-LAUNCH-03: a VMM that cannot be run is an error naming it (the descriptors close with gpupass)
  gpupass launch --device $D -- /nonexistent/vmm > launch-bad.txt 2> launch-bad.err
  rc=$?
  if [ $rc = 1 ] && grep -q "cannot run /nonexistent/vmm" launch-bad.err; then
    lab_pass launch-exec-error "$(cat launch-bad.err)"
  else
    lab_fail launch-exec-error "rc=$rc $(tr '\n' ' ' < launch-bad.err)"
  fi
else
  gpupass launch --device $D -- $Q -version > launch.txt 2> launch.err
  rc=$?
  if [ $rc = 1 ] && grep -q "predates the VFIO device cdev" launch.err; then
    lab_pass launch-refused "$(cat launch.err)"
  else
    lab_fail launch-refused "rc=$rc $(tr '\n' ' ' < launch.err)"
  fi
fi

# ---- 2. the 16 GiB BAR (ivshmem-plain 00:0c.0), with QEMU's default 64-bit window size and
# with -global q35-pcihost.pci-hole64-size=64G
big_orig=$(lab_driver $BIG)
lab_run big-bind big-bind.txt gpupass bind $BIG
lab_expect big-bind-driver vfio-pci "$(lab_driver $BIG)"
lab_run big-qemu-args big-qemu-args.txt gpupass qemu-args --cpu none --qemu $Q $BIG
lab_pass big-l1-bars "$(l1_bars $BIG raw | tr '\n' ' ')(hex sizes; L1 BAR2 at $(head -3 /sys/bus/pci/devices/$BIG/resource | tail -1 | cut -d' ' -f1))"
# shellcheck disable=SC2046
l2_run seabios-big "$(ids $BIG)" $(cat big-qemu-args.txt)
lab_expect big-exit 0 "$L2_RC"
lab_pass big-start "first firmware output ${L2_FIRST} s, PCI set up ${L2_ENUM} s, QEMU gone ${L2_TOTAL} s"
seen big- $BIG seabios-big.log
a=$(l2_addr 01:00.0 2 seabios-big.log)
if [ -n "$a" ] && [ $((0x$a)) -ge $((1 << 32)) ]; then
  lab_pass big-above-4g "BAR2 at 0x$a; $(grep -m1 '^PCI: 64:' seabios-big.log)"
else
  lab_fail big-above-4g "BAR2 at '$a'; $(grep -E '^PCI: (32|64):|out of' seabios-big.log | tr '\n' ';')"
fi
window big- seabios-big.log
# gpupass sized the window from the BARs (16 GiB -> twice the next power of two, at least 32G)
lab_expect big-sized-window "q35-pcihost.pci-hole64-size=32G" "$(grep -o 'q35-pcihost.pci-hole64-size=[0-9A-Z]*' big-qemu-args.txt)"
gpupass qemu-args --cpu none --qemu $Q $BIG --pci-hole64 64G > big-hole64-args.txt 2> big-hole64-args.err
# shellcheck disable=SC2046
l2_run seabios-hole64 "$(ids $BIG)" $(cat big-hole64-args.txt)
lab_expect big-hole64-exit 0 "$L2_RC"
lab_expect big-hole64-bars "$(l2_bars 01:00.0 seabios-big.log | tr '\n' ' ')" "$(l2_bars 01:00.0 seabios-hole64.log | tr '\n' ' ')"
window big-hole64- seabios-hole64.log

# ---- 3. everything back as it was
lab_run unbind unbind.txt gpupass unbind $D
lab_expect restored "$orig" "$(lab_driver $D)"
lab_run big-unbind big-unbind.txt gpupass unbind $BIG
lab_expect big-restored "$big_orig" "$(lab_driver $BIG)"
lab_pass duration "scenario took $(secs $(($(cs) - T0))) s"
