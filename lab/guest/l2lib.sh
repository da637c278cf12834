# Helpers for the scenarios that boot Linux in an L2 VM (l2linux, l2ovmf, l2libvirt), sourced by them;
# lab.sh puts this file at /lab/l2/lib.sh with "# lab-carry: kernel", beside /lab/l2/bzImage
# (the leg's kernel) and /lab/l2/initrd.gz (busybox + lab/guest/l2init, whose L2-* console
# lines the functions below read).

Q=/opt/qemu/bin/qemu-system-x86_64
D=0000:00:03.0       # bochs-display: 16 MiB prefetchable BAR0, 4 KiB BAR2, 32 KiB ROM
BIG=0000:00:0c.0     # ivshmem-plain: 256 B BAR0, 16 GiB 64-bit prefetchable BAR2
HUGE=0000:00:0f.0    # ivshmem-plain with a 64 GiB BAR2: only in boots that declare it (l2huge,
                     # l2libvirt); a scenario passing it sets BIG=$HUGE (the functions below
                     # judge $D and $BIG)
WIN_G=32             # the window gpupass sizes for $D and $BIG, GiB (l2_prepare, inwindow)
OVMF=/opt/ovmf/OVMF.fd

cs() { read -r _u _ < /proc/uptime; echo "${_u%.*}${_u#*.}"; }
secs() { echo "$(($1 / 100)).$(printf '%02d' $(($1 % 100)))"; }
alive() { [ -d "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }
ids() { echo "$(sed 's/^0x//' "/sys/bus/pci/devices/$1/vendor"):$(sed 's/^0x//' "/sys/bus/pci/devices/$1/device")"; }

# boot_l2 NAME ACCEL LIMIT QEMU_ARGS...: boot the L2 Linux (QEMU killed after LIMIT s); its
# console goes to NAME.txt. Sets L2_RC and L2_SECS (QEMU's start to its exit, as L1 measures it).
boot_l2() {
  local n=$1 accel=$2 limit=$3
  shift 3
  boot_l2_cmd "$n" "$limit" $Q -accel "$accel" -M q35 -m 256 -smp 1 -nodefaults -display none \
    -no-reboot -kernel /lab/l2/bzImage -initrd /lab/l2/initrd.gz \
    -append "console=ttyS0 panic=-1 quiet" -serial "file:$n.console" "$@"
}
# boot_l2_cmd NAME LIMIT QEMU COMMAND...: boot_l2 with a whole QEMU command line of its own,
# whose first serial port writes NAME.console (l2libvirt: the line libvirt made).
boot_l2_cmd() {
  local n=$1 limit=$2 t0 pid
  shift 2
  rm -f "$n.console" "$n.txt"
  echo "\$ $*"
  t0=$(cs)
  "$@" > "$n.out" 2>&1 &
  pid=$!
  # NAME.timeline: when (seconds after QEMU's start, L1's clock) the L2 console first showed
  # each stage, so a slow or stuck L2 boot says where it was.
  # The L2 kernel is quiet until /init; its first sign is its PMU probe, which L1's KVM logs
  # (no vPMU in L1: "Unhandled WRMSR(0xc0010007) = 0xffff", the L2 perf driver's check).
  : > "$n.timeline"
  local seen=' ' m wr0 wr
  wr0=$(dmesg | grep -c 'Unhandled WRMSR')
  while alive $pid; do
    case $seen in
      *"|wrmsr|"*) ;;
      *)
        wr=$(dmesg | grep -c 'Unhandled WRMSR')
        if [ "$wr" -gt "$wr0" ]; then
          seen="$seen|wrmsr|"
          echo "$(secs $(($(cs) - t0))) L1 KVM: $(dmesg | grep 'Unhandled WRMSR' | tail -1)" >> "$n.timeline"
        fi
        ;;
    esac
    for m in 'L2-BOOT' 'L2-END' 'reboot: Power down'; do
      case $seen in *"|$m|"*) continue ;; esac
      if grep -q "$m" "$n.console" 2>/dev/null; then
        seen="$seen|$m|"
        echo "$(secs $(($(cs) - t0))) $m" >> "$n.timeline"
      fi
    done
    if [ $(($(cs) - t0)) -gt $((limit * 100)) ]; then
      echo "L2 $n: still running after $limit s, killing QEMU" >> "$n.out"
      echo "$(secs $(($(cs) - t0))) killed (limit $limit s)" >> "$n.timeline"
      kill $pid; sleep 1; kill -9 $pid 2>/dev/null
      break
    fi
    sleep 0.5
  done
  wait $pid
  L2_RC=$?
  L2_SECS=$(secs $(($(cs) - t0)))
  echo "$L2_SECS QEMU exited ($L2_RC)" >> "$n.timeline"
  cat "$n.timeline"
  lab_file "$n.timeline" "$n.timeline"
  tr -d '\r' < "$n.console" > "$n.txt" 2>/dev/null
  cat "$n.out"
  grep '^L2-' "$n.txt"
  lab_file "$n.txt" "$n.txt"
  [ -s "$n.out" ] && lab_file "$n.out" "$n.out"
  return 0
}

# l2_bdf IDS LOG: the L2 address of the function with vendor:device IDS.
l2_bdf() { sed -n "s/^L2-PCI \([^ ]*\) $1 .*/\1/p" "$2" | head -1; }
# l2_res BDF BAR LOG: "start end flags" of that BAR in the L2 sysfs.
l2_res() { sed -n "s/^L2-RES $1 $2 //p" "$3" | head -1; }
# bars_of: "bar size" (hex) per BAR 0-5 with a size, from `resource` lines on stdin
# ("start end flags" each, in order).
bars_of() {
  _i=0
  while read -r _s _e _f; do
    [ $_i -gt 5 ] && break
    [ $((_e)) -ne 0 ] && printf '%d %x\n' $_i $((_e - _s + 1))
    _i=$((_i + 1))
  done
}
l1_bars() { bars_of < "/sys/bus/pci/devices/$1/resource" | tr '\n' ' '; }
l2_bars() { sed -n "s/^L2-RES $1 [0-9]* //p" "$2" | bars_of | tr '\n' ' '; }
# l2_unassigned BDF LOG: the BARs 0-5 of BDF with a size but no address in L2 (start 0).
l2_unassigned() {
  sed -n "s/^L2-RES $1 \([0-5]\) //p" "$2" | {
    _i=0
    while read -r _s _e _f; do
      [ $((_e)) -ne 0 ] && [ $((_s)) -eq 0 ] && printf '%d ' $_i
      _i=$((_i + 1))
    done
  }
}
# root_window ADDR LOG: "start end" of the L2 root bus window (ACPI _CRS, as the L2 kernel
# logged it) holding ADDR; with ADDR 0, the first window above 4 GiB.
root_window() {
  sed -n 's/^L2-KMSG .*pci_bus 0000:00: root bus resource \[mem \(0x[0-9a-f]*\)-\(0x[0-9a-f]*\).*/\1 \2/p' "$2" |
    while read -r _s _e; do
      if [ "$1" = 0 ]; then
        [ $((_s)) -ge $((1 << 32)) ] && { echo "$_s $_e"; break; }
      elif [ $((_s)) -le $(($1)) ] && [ $(($1)) -le $((_e)) ]; then
        echo "$_s $_e"; break
      fi
    done
}

# booted PREFIX LOG: the L2 kernel reached /init (L2-BOOT ... L2-END) and is L1's kernel.
booted() {
  local p=$1 log=$2 line
  line=$(grep -m1 '^L2-BOOT ' "$log")
  if [ -n "$line" ] && grep -q '^L2-END' "$log" && [ "$(echo "$line" | cut -d' ' -f2)" = "$(uname -r)" ]; then
    lab_pass "${p}boot" "L2 kernel $(uname -r) at init after $(echo "$line" | cut -d' ' -f3) s of its uptime; QEMU exit $L2_RC after $L2_SECS s; $(grep -m1 '^L2-CPU ' "$log" | cut -d' ' -f2-)"
  else
    lab_fail "${p}boot" "rc=$L2_RC after $L2_SECS s; '$line'; last: $(tail -3 "$log" | tr '\n' ' ') $(tail -2 "${log%.txt}.out" 2>/dev/null | tr '\n' ' ')"
  fi
}
# listed PREFIX LOG: the L2 kernel lists both functions with L1's IDs; sets L2D, L2BIG.
listed() {
  local p=$1 log=$2
  L2D=$(l2_bdf "$(ids $D)" "$log") L2BIG=$(l2_bdf "$(ids $BIG)" "$log")
  if [ -n "$L2D" ] && [ -n "$L2BIG" ]; then
    lab_pass "${p}ids" "$D $(ids $D) is L2 $L2D; $BIG $(ids $BIG) is L2 $L2BIG"
  else
    lab_fail "${p}ids" "L2 functions: $(sed -n 's/^L2-PCI //p' "$log" | tr '\n' ';')"
  fi
}
# assigned PREFIX LOG: every BAR 0-5 of both functions has L1's size and an address in L2.
assigned() {
  local p=$1 log=$2 want got un
  want="$(l1_bars $D)| $(l1_bars $BIG)"
  got="$(l2_bars "${L2D:-none}" "$log")| $(l2_bars "${L2BIG:-none}" "$log")"
  un="$(l2_unassigned "${L2D:-none}" "$log")$(l2_unassigned "${L2BIG:-none}" "$log")"
  if [ "$want" = "$got" ] && [ -z "$un" ]; then
    lab_pass "${p}bars" "sizes $got(bar size, hex; = L1's); $L2D BAR0 $(l2_res "$L2D" 0 "$log" | cut -d' ' -f1), $L2BIG BAR0 $(l2_res "$L2BIG" 0 "$log" | cut -d' ' -f1) BAR2 $(l2_res "$L2BIG" 2 "$log" | cut -d' ' -f1-2)"
  else
    lab_fail "${p}bars" "want sizes '$want' got '$got'; unassigned: '$un'; $(grep "^L2-KMSG.*\(no space\|failed to assign\)" "$log" | head -3 | tr '\n' ';')"
  fi
}
# above4g PREFIX LOG: BAR2 of the big function lies above 4 GiB.
above4g() {
  local p=$1 log=$2 s
  s=$(l2_res "${L2BIG:-none}" 2 "$log" | cut -d' ' -f1)
  if [ -n "$s" ] && [ $((s)) -ge $((1 << 32)) ]; then
    lab_pass "${p}above-4g" "BAR2 at $s ($(($((s)) >> 30)) GiB)"
  else
    lab_fail "${p}above-4g" "BAR2 at '$s'"
  fi
}
# big_size: the size in bytes of $BIG's BAR2 in L1.
big_size() {
  set -- $(sed -n 3p "/sys/bus/pci/devices/$BIG/resource")
  echo $(($2 - $1 + 1))
}
# inwindow PREFIX LOG SIZE: BAR2 (its whole L1 size) lies in the L2 kernel's 64-bit root bus
# window, of SIZE bytes (the window gpupass set).
inwindow() {
  local p=$1 log=$2 want=$3 s w ws we z
  s=$(l2_res "${L2BIG:-none}" 2 "$log" | cut -d' ' -f1)
  w=$(root_window "${s:-0}" "$log")
  ws=${w% *} we=${w#* } z=$(big_size)
  if [ -n "$w" ] && [ $((s + z - 1)) -le $((we)) ] && [ $((we - ws + 1)) -eq "$want" ]; then
    lab_pass "${p}window" "BAR2 $s+$((z >> 30))G inside root bus window [$ws-$we] ($(((we - ws + 1) >> 30)) GiB)"
  else
    lab_fail "${p}window" "BAR2 '$s', window '$w', want a window of $((want >> 30)) GiB holding it: $(grep 'root bus resource' "$log" | tr '\n' ';')"
  fi
}

# l2_mem_bars BDF LOG: "index start end" of each memory BAR 0-5 of BDF with an address, from
# the L2 sysfs `resource` lines (flags bit 9: IORESOURCE_MEM).
l2_mem_bars() {
  sed -n "s/^L2-RES $1 \([0-5]\) /\1 /p" "$2" | while read -r _i _s _e _f; do
    [ $((_e)) -ne 0 ] && [ $((_s)) -ne 0 ] && [ $((_f & 0x200)) -ne 0 ] && echo "$_i $_s $_e"
  done
}
# iomem PREFIX LOG: every memory BAR of both functions is in the L2 kernel's /proc/iomem as
# "start-end : BDF" (nested under its root port's window), inside a top-level "PCI Bus
# 0000:00" entry: a window of the host bridge (ACPI _CRS), as that kernel claimed them.
iomem() {
  local p=$1 log=$2 bdf i s e n=0 bad= line dots rest a b top mine
  for bdf in ${L2D:-none} ${L2BIG:-none}; do
    while read -r i s e; do
      n=$((n + 1)) top= mine=
      while IFS= read -r line; do
        dots=${line%%[0-9a-f]*} rest=${line#"$dots"}
        a=0x${rest%%-*} b=${rest#*-} b=0x${b%% *}
        case "$dots:${rest#* : }" in
          ":PCI Bus 0000:00") [ $((a)) -le $((s)) ] && [ $((e)) -le $((b)) ] && top="$rest" ;;
          .*:"$bdf") [ $((a)) -eq $((s)) ] && [ $((b)) -eq $((e)) ] && mine=1 ;;
        esac
      done <<EOF2
$(sed -n 's/^L2-IOMEM //p' "$log")
EOF2
      [ -n "$top" ] && [ -n "$mine" ] || bad="$bad $bdf BAR$i $s-$e (own entry: ${mine:-no}, in a host bridge window: ${top:-no});"
    done <<EOF2
$(l2_mem_bars "$bdf" "$log")
EOF2
  done
  if [ $n -gt 0 ] && [ -z "$bad" ]; then
    lab_pass "${p}iomem" "$n memory BARs in /proc/iomem, each inside a 'PCI Bus 0000:00' window; $L2BIG BAR2 in [$(sed -n 's/^L2-IOMEM \([0-9a-f]*-[0-9a-f]*\) : PCI Bus 0000:00$/\1/p' "$log" | while read -r w; do [ $((0x${w%-*})) -ge $((1 << 32)) ] && echo "$w"; done | head -1)]"
  else
    lab_fail "${p}iomem" "$n BARs;$bad $(grep -c '^L2-IOMEM' "$log") iomem lines"
  fi
}
# l2_lspci LOG: pciutils' `lspci -D -vv -n` (carried into L1 at /lab/l2/pciutils) over the
# config space the L2 kernel printed for the passed functions (L2-CFG lines, `lspci -x`'s
# format), as L2-LSPCI lines: the BARs as lspci decodes them from L2's registers.
l2_lspci() {
  local b pu=${L2_PCIUTILS:-/lab/l2/pciutils}
  for b in $(sed -n 's/^L2-CFG \([^ ]*\) 00: .*/\1/p' "$1"); do
    echo "$b 0000: 0000:0000"
    sed -n "s/^L2-CFG $b //p" "$1"
    echo
  done > "${1%.txt}.cfg"
  "$pu"/ld-linux-x86-64.so.2 --library-path "$pu" "$pu/lspci" -D -vv -n -F "${1%.txt}.cfg" 2>&1 |
    sed 's/^/L2-LSPCI /'
}
# lspcivv PREFIX LOG: lspci -vv over the L2 kernel's config space shows each memory BAR of both
# functions as a Region at the address that kernel gave it (its sysfs `resource`), none
# "[disabled]" (memory decode off), "<unassigned>" or "[virtual]". Writes LOG's .lspci.
lspcivv() {
  local p=$1 log=$2 bdf i s e n=0 bad= block r out=${2%.txt}.lspci
  l2_lspci "$log" > "$out"
  lab_file "$out" "$out"
  for bdf in ${L2D:-none} ${L2BIG:-none}; do
    block=$(sed -n "/^L2-LSPCI $bdf /,/^L2-LSPCI *\$/p" "$out")
    while read -r i s e; do
      n=$((n + 1))
      r=$(echo "$block" | grep "Region $i: Memory at $(printf '%x' $((s))) ")
      if [ -z "$r" ] || echo "$r" | grep -q -e disabled -e unassigned -e virtual; then
        bad="$bad $bdf BAR$i at $s: '${r:-no Region line}';"
      fi
    done <<EOF2
$(l2_mem_bars "$bdf" "$log")
EOF2
  done
  if [ $n -gt 0 ] && [ -z "$bad" ]; then
    lab_pass "${p}lspci" "$n Regions at the kernel's addresses, none disabled; $L2BIG $(sed -n "/^L2-LSPCI $L2BIG /,/^L2-LSPCI *\$/p" "$out" | grep -m1 'Region 2:' | sed 's/^L2-LSPCI[[:space:]]*//')"
  else
    lab_fail "${p}lspci" "$n BARs;$bad $(grep -c '^L2-LSPCI' "$out") lspci lines: $(head -3 "$out" | tr '\n' ';')"
  fi
}
# huge_l1_bar: step huge-l1-bar: $BIG's BAR2 is 64 GiB with an address in L1 (l2huge, l2libvirt).
huge_l1_bar() {
  set -- $(sed -n 3p "/sys/bus/pci/devices/$BIG/resource" 2>/dev/null)
  if [ $# -ge 2 ] && [ $(($2 - $1 + 1)) -eq $((64 << 30)) ] && [ $(($1)) -ne 0 ]; then
    lab_pass huge-l1-bar "$BIG BAR2 [$1-$2] (64 GiB) in L1"
  else
    lab_fail huge-l1-bar "$BIG BAR2 '$*': want 64 GiB with an address in L1"
  fi
}
# big_marker MARKER: step big-marker: L1 writes MARKER at the start of $BIG's BAR2 (busybox
# devmem at L1's own address, before vfio-pci has it), for the L2 kernel to read back through
# its own mapping of the BAR (reads).
big_marker() {
  local bstart got
  set -- "$1" $(sed -n 3p "/sys/bus/pci/devices/$BIG/resource")
  bstart=$(printf '0x%x' $(($2)))
  devmem "$bstart" 32 "$1"
  got=$(devmem "$bstart" 32)
  if [ $((${got:-0})) -eq $(($1)) ]; then
    lab_pass big-marker "$1 at $bstart (L1's BAR2 of $BIG)"
  else
    lab_fail big-marker "devmem $bstart read '$(devmem "$bstart" 32 2>&1)' after writing $1"
  fi
}
# reads PREFIX LOG MARKER: the L2 kernel read through the BARs (busybox devmem at their L2
# addresses): bochs-display's dispi ID 0xB0C5 at BAR2 + 0x500, and MARKER, which L1 wrote at
# the start of ivshmem's BAR2 before passing it on (big_marker).
reads() {
  local p=$1 log=$2 marker=$3 dispi first
  dispi=$(sed -n "s/^L2-READ ${L2D:-none} 2 [^ ]* 16 //p" "$log" | head -1)
  first=$(sed -n "s/^L2-READ ${L2BIG:-none} 2 [^ ]* 32 //p" "$log" | head -1)
  case "$dispi $first" in
    0x*" "0x*)
      if [ $((dispi)) -eq $((0xb0c5)) ] && [ $((first)) -eq $((marker)) ]; then
        lab_pass "${p}reads" "dispi $dispi at $L2D BAR2+0x500; $first at the start of $L2BIG BAR2 ($(sed -n "s/^L2-READ ${L2BIG:-none} 2 \([^ ]*\) 32 .*/\1/p" "$log" | head -1))"
        return
      fi
      ;;
  esac
  lab_fail "${p}reads" "dispi '$dispi' (want 0xB0C5), BAR2 first '$first' (want $marker): $(grep '^L2-READ' "$log" | tr '\n' ';')"
}

# judged PREFIX LOG MARKER: the L2 kernel's whole view of $D and $BIG (steps PREFIX boot, ids,
# bars, above-4g, window: of $WIN_G GiB, iomem, lspci, reads: MARKER at the start of BAR2).
judged() {
  booted "$1" "$2"
  listed "$1" "$2"
  assigned "$1" "$2"
  above4g "$1" "$2"
  inwindow "$1" "$2" $((WIN_G << 30))
  iomem "$1" "$2"
  lspcivv "$1" "$2"
  reads "$1" "$2" "$3"
}
# l2_finish: steps unbind, restored, big-unbind, big-restored: both functions back on the
# drivers l2_prepare found ($orig, $big_orig); duration: since $T0.
l2_finish() {
  lab_run unbind unbind.txt gpupass unbind $D
  lab_expect restored "$orig" "$(lab_driver $D)"
  lab_run big-unbind big-unbind.txt gpupass unbind $BIG
  lab_expect big-restored "$big_orig" "$(lab_driver $BIG)"
  lab_pass duration "scenario took $(secs $(($(cs) - T0))) s"
}

# l2_prepare: the steps the L2 Linux scenarios start with. l2-kernel: the carried kernel is
# the one L1 runs (its version string is in the bzImage header); bind/big-bind: $D and $BIG on
# vfio-pci through `gpupass bind` (orig, big_orig: the drivers they had); qemu-args for both;
# sized-window: 16 GiB of 64-bit BARs -> twice the next power of two, 32G, and OVMF the same
# in MiB ($WIN_G GiB: 128 for the 64 GiB BAR).
l2_prepare() {
  if [ -s /lab/l2/bzImage ] && grep -q "$(uname -r) " /lab/l2/bzImage; then
    lab_pass l2-kernel "/lab/l2/bzImage $(wc -c < /lab/l2/bzImage) bytes, $(uname -r); initrd $(wc -c < /lab/l2/initrd.gz) bytes"
  else
    lab_fail l2-kernel "/lab/l2/bzImage missing or not $(uname -r)"
  fi

  orig=$(lab_driver $D)
  big_orig=$(lab_driver $BIG)
  lab_run bind bind.txt gpupass bind $D
  lab_expect bind-driver vfio-pci "$(lab_driver $D)"
  lab_run big-bind big-bind.txt gpupass bind $BIG
  lab_expect big-bind-driver vfio-pci "$(lab_driver $BIG)"
  # --cpu none: the L2 keeps its own CPU (TCG has no `host` model; under the lab's nested KVM
  # `host` would be L1's emulated CPU), so the arguments carry no -cpu, as before; --qemu $Q:
# --backend auto asks that QEMU's version (10.0) before it emits iommufd.
  lab_run qemu-args qemu-args.txt gpupass qemu-args --cpu none --qemu $Q $D $BIG
  lab_expect sized-window "q35-pcihost.pci-hole64-size=${WIN_G}G name=opt/ovmf/X-PciMmio64Mb,string=$((WIN_G * 1024))" \
    "$(grep -o -e 'q35-pcihost.pci-hole64-size=[0-9A-Z]*' -e 'name=opt/ovmf/X-PciMmio64Mb,string=[0-9]*' qemu-args.txt | tr '\n' ' ' | sed 's/ $//')"
}
