# lab-about: benchmark: bind+unbind round trip of the 00:05.0+00:05.1 group: gpupass vs the same sysfs writes from a shell, and vs Debian's driverctl
# lab-needs: gpupass
# lab-files: /bin/bash /usr/sbin/driverctl
# lab-timeout: 300
# Not a timed test: it reports figures (LAB-RESULT ... PASS <numbers>) for docs/performance.md.
#
# One round trip moves the two-function IOMMU group 00:05.0 (bochs-drm) + 00:05.1
# (snd_hda_intel) to vfio-pci and back, verifying each driver. Contenders, interleaved round by
# round:
#   floor-inline  the 12 writes and the driver checks as a function of the running shell:
#                 no process start at all (the cheapest thing that can be called a bind)
#   floor-script  the same writes and checks as two busybox sh scripts, bind.sh then
#                 unbind.sh: what "a plain shell script" costs, a process per command as for
#                 gpupass
#   gpupass       gpupass bind 00:05.0, gpupass unbind 00:05.0 (group discovery, in-use
#                 checks, journal, verification)
#   driverctl     Debian's driverctl set-override/unset-override, one call per function
#                 (it has no notion of groups): 4 bash processes
# Clock: bash's $EPOCHREALTIME (microseconds, no process start), so the bench loop runs in
# bash; medians over N rounds. Everything in the guest is emulated (TCG), the kernel's probe
# and remove included: absolute figures are far above hardware, ratios are the result.
#
# snd_hda_intel probes at most SNDRV_CARDS (32) times per boot (a static counter in azx_probe
# that remove never decrements): after that drivers_probe "succeeds" and binds nothing. Each
# round reprobes it once per contender, so N is kept at 7 (1 warm-up + 4*7 + the boot's own).
N=${BENCH_N:-7}
VGA=0000:00:05.0
HDA=0000:00:05.1
D=/sys/bus/pci/devices
drv() { basename "$(readlink $D/$1/driver)" 2>/dev/null; }

if ! command -v bash > /dev/null 2>&1; then
  lab_fail bash "bash is not in the guest (lab-files)"
  return 0 2> /dev/null || exit 0
fi

# The floor's checks are test(1) builtins (`-ef` compares the driver link with the driver
# directory, `-c` the group node): no process at all, in bash or in busybox sh.
cat > /tmp/bind.sh <<'EOS'
D=/sys/bus/pci/devices; P=/sys/bus/pci/drivers; VGA=0000:00:05.0; HDA=0000:00:05.1
echo vfio-pci > $D/$HDA/driver_override; echo $HDA > $P/snd_hda_intel/unbind
echo $HDA > /sys/bus/pci/drivers_probe; [ $D/$HDA/driver -ef $P/vfio-pci ] || exit 1
echo vfio-pci > $D/$VGA/driver_override; echo $VGA > $P/bochs-drm/unbind
echo $VGA > /sys/bus/pci/drivers_probe; [ $D/$VGA/driver -ef $P/vfio-pci ] || exit 1
[ -c /dev/vfio/4 ] || exit 1
EOS
cat > /tmp/unbind.sh <<'EOS'
D=/sys/bus/pci/devices; P=/sys/bus/pci/drivers; VGA=0000:00:05.0; HDA=0000:00:05.1
echo > $D/$VGA/driver_override; echo $VGA > $P/vfio-pci/unbind
echo $VGA > /sys/bus/pci/drivers_probe; [ $D/$VGA/driver -ef $P/bochs-drm ] || exit 1
echo > $D/$HDA/driver_override; echo $HDA > $P/vfio-pci/unbind
echo $HDA > /sys/bus/pci/drivers_probe; [ $D/$HDA/driver -ef $P/snd_hda_intel ] || exit 1
EOS
[ "$(basename "$(readlink $D/$VGA/iommu_group)")" = 4 ] || lab_fail group "00:05.0 is not in IOMMU group 4 (lab.md's map changed?)"

cat > /tmp/bench.bash <<'EOS'
N=$1
D=/sys/bus/pci/devices; VGA=0000:00:05.0; HDA=0000:00:05.1
drv() { local l; l=$(readlink $D/$1/driver) && echo "${l##*/}"; }
floor_script() { sh /tmp/bind.sh && sh /tmp/unbind.sh; }
gpupass_rt() { gpupass bind 00:05.0 > /dev/null && gpupass unbind 00:05.0 > /dev/null; }
driverctl_rt() {
  driverctl set-override $HDA vfio-pci && driverctl set-override $VGA vfio-pci &&
    driverctl unset-override $VGA && driverctl unset-override $HDA &&
    [ $D/$VGA/driver -ef /sys/bus/pci/drivers/bochs-drm ] && [ $D/$HDA/driver -ef /sys/bus/pci/drivers/snd_hda_intel ]
}
# The inline floor sources the same lines (an `exit 1` would end the bench: `return 1`).
sed 's/|| exit 1/|| return 1/' /tmp/bind.sh > /tmp/bind.src
sed 's/|| exit 1/|| return 1/' /tmp/unbind.sh > /tmp/unbind.src
floor_inline() { . /tmp/bind.src && . /tmp/unbind.src; }
floor_inline || { echo "FAIL warmup $(drv $VGA) $(drv $HDA)"; exit 1; }
for c in floor_inline floor_script gpupass_rt driverctl_rt; do : > /tmp/t.$c; done
# $EPOCHREALTIME is read without a process (a $(...) costs a fork: ~5 ms here).
i=0
while [ $i -lt $N ]; do
  for c in floor_inline floor_script gpupass_rt driverctl_rt; do
    t0=${EPOCHREALTIME/./}; $c || { echo "FAIL $c round $i: $(drv $VGA) $(drv $HDA)"; exit 1; }; t1=${EPOCHREALTIME/./}
    echo $((10#$t1 - 10#$t0)) >> /tmp/t.$c
  done
  i=$((i + 1))
done
# Process start alone.
for c in true_exec version_exec; do : > /tmp/t.$c; done
i=0
while [ $i -lt 20 ]; do
  t0=${EPOCHREALTIME/./}; /bin/true; t1=${EPOCHREALTIME/./}; echo $((10#$t1 - 10#$t0)) >> /tmp/t.true_exec
  t0=${EPOCHREALTIME/./}; gpupass --version > /dev/null; t1=${EPOCHREALTIME/./}; echo $((10#$t1 - 10#$t0)) >> /tmp/t.version_exec
  i=$((i + 1))
done
med() { sort -n /tmp/t.$1 | awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.1f", m / 1000 }'; }
for c in floor_inline floor_script gpupass_rt driverctl_rt true_exec version_exec; do
  echo "MEDIAN $c $(med $c) $(tr '\n' ' ' < /tmp/t.$c)"
done
EOS

out=$(bash /tmp/bench.bash "$N" 2>&1)
echo "$out"
if echo "$out" | grep -q '^FAIL'; then
  lab_fail round-trip "$(echo "$out" | grep '^FAIL' | head -1)"
else
  m() { echo "$out" | awk -v c="$1" '$1 == "MEDIAN" && $2 == c { print $3 }'; }
  fi_=$(m floor_inline); fs=$(m floor_script); gp=$(m gpupass_rt); dc=$(m driverctl_rt)
  r() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
  lab_pass floor-inline "$fi_ ms median per round trip: the writes and checks inside the running shell (N=$N)"
  lab_pass floor-script "$fs ms median: the same as two busybox sh scripts, bind.sh + unbind.sh (N=$N)"
  lab_pass gpupass "$gp ms median: gpupass bind + gpupass unbind (N=$N); $(r "$gp" "$fs")x floor-script, $(r "$gp" "$fi_")x floor-inline"
  lab_pass driverctl "$dc ms median: driverctl set-override x2 + unset-override x2 (N=$N); gpupass is $(r "$gp" "$dc")x driverctl"
  lab_pass exec "$(m true_exec) ms median /bin/true, $(m version_exec) ms gpupass --version (20 each)"
fi
lab_expect end-drivers "bochs-drm snd_hda_intel" "$(drv $VGA) $(drv $HDA)"
