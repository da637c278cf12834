# lab-about: benchmark: bind+unbind round trip of the 00:05.0+00:05.1 group: gpupass vs the same sysfs writes from a shell, and vs Debian's driverctl
# lab-needs: gpupass
# lab-files: /bin/bash /usr/sbin/driverctl
# lab-timeout: 300
# lab-steps: floor-idiom floor-strict floor-script gpupass driverctl exec end-drivers
# Not a timed test: it reports figures (LAB-RESULT ... PASS <numbers>) for docs/performance.md.
#
# One round trip moves the two-function IOMMU group 00:05.0 (bochs-drm) + 00:05.1
# (snd_hda_intel) to vfio-pci and back, verifying each driver. Contenders, interleaved round by
# round, all started from this busybox shell:
#   floor-idiom   the 12 writes, with the checks written the usual way (`$(readlink ...)`,
#                 `basename`), as a function of this shell: the floor this bench used first
#   floor-strict  the same writes with fork-free checks (test -ef on the driver link, -c on
#                 the group node), as a function of this shell: no process at all, the
#                 cheapest thing that can be called a bind
#   floor-script  floor-strict's lines as two busybox sh scripts, bind.sh then unbind.sh: a
#                 process per command, as for gpupass
#   gpupass       gpupass bind 00:05.0, gpupass unbind 00:05.0 (group discovery, in-use
#                 checks, journal, verification)
#   driverctl     Debian's driverctl set-override/unset-override, one call per function (it
#                 has no notion of groups): 4 bash processes
# Clock: busybox adjtimex (microseconds). Reading it costs a process, the same for every
# interval; the median of empty intervals is subtracted. Medians over N rounds. Everything in
# the guest is emulated (TCG), the kernel's probe and remove included: absolute figures are far
# above hardware, ratios are the result.
#
# snd_hda_intel probes at most SNDRV_CARDS (32) times per boot (a static counter in azx_probe
# that remove never decrements): after that drivers_probe "succeeds" and binds nothing. Each
# round reprobes it once per contender, so N is 5 (1 warm-up + 5*5 + the boot's own).
N=${BENCH_N:-5}
VGA=0000:00:05.0
HDA=0000:00:05.1
D=/sys/bus/pci/devices
P=/sys/bus/pci/drivers
drv() { basename "$(readlink $D/$1/driver)" 2>/dev/null; }
[ "$(basename "$(readlink $D/$VGA/iommu_group)")" = 4 ] || lab_fail group "00:05.0 is not in IOMMU group 4 (lab.md's map changed?)"

# now (lab/guest/lib.sh): T = the clock in microseconds.
now() { lab_now_us; }

floor_idiom() {
  echo vfio-pci > $D/$HDA/driver_override; echo $HDA > $P/snd_hda_intel/unbind
  echo $HDA > /sys/bus/pci/drivers_probe; [ "$(drv $HDA)" = vfio-pci ] || return 1
  echo vfio-pci > $D/$VGA/driver_override; echo $VGA > $P/bochs-drm/unbind
  echo $VGA > /sys/bus/pci/drivers_probe; [ "$(drv $VGA)" = vfio-pci ] || return 1
  [ -c /dev/vfio/$(basename "$(readlink $D/$VGA/iommu_group)") ] || return 1
  echo > $D/$VGA/driver_override; echo $VGA > $P/vfio-pci/unbind
  echo $VGA > /sys/bus/pci/drivers_probe; [ "$(drv $VGA)" = bochs-drm ] || return 1
  echo > $D/$HDA/driver_override; echo $HDA > $P/vfio-pci/unbind
  echo $HDA > /sys/bus/pci/drivers_probe; [ "$(drv $HDA)" = snd_hda_intel ] || return 1
}
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
# The strict floor sources the same lines (an `exit 1` would end the bench: `return 1`).
sed 's/|| exit 1/|| return 1/' /tmp/bind.sh > /tmp/bind.src
sed 's/|| exit 1/|| return 1/' /tmp/unbind.sh > /tmp/unbind.src
floor_strict() { . /tmp/bind.src && . /tmp/unbind.src; }
floor_script() { sh /tmp/bind.sh && sh /tmp/unbind.sh; }
gpupass_rt() { gpupass bind 00:05.0 > /dev/null && gpupass unbind 00:05.0 > /dev/null; }
driverctl_rt() {
  driverctl set-override $HDA vfio-pci && driverctl set-override $VGA vfio-pci &&
    driverctl unset-override $VGA && driverctl unset-override $HDA &&
    [ $D/$VGA/driver -ef $P/bochs-drm ] && [ $D/$HDA/driver -ef $P/snd_hda_intel ]
}
CONTENDERS="floor_idiom floor_strict floor_script gpupass_rt"
if command -v driverctl > /dev/null 2>&1 && command -v bash > /dev/null 2>&1; then
  CONTENDERS="$CONTENDERS driverctl_rt"
else
  lab_fail driverctl "driverctl or bash is not in the guest (lab-files)"
fi

floor_strict || lab_fail warm-up "$(drv $VGA) $(drv $HDA)"
for c in $CONTENDERS clock true_exec version_exec; do : > /tmp/t.$c; done
ok=1
i=0
while [ $i -lt $N ] && [ $ok = 1 ]; do
  for c in $CONTENDERS; do
    now; t0=$T
    $c || { ok=0; lab_fail round-trip "$c, round $i: $(drv $VGA) $(drv $HDA)"; break; }
    now; echo $((T - t0)) >> /tmp/t.$c
  done
  i=$((i + 1))
done
i=0
while [ $i -lt 15 ]; do
  now; t0=$T; now; echo $((T - t0)) >> /tmp/t.clock
  now; t0=$T; /bin/true; now; echo $((T - t0)) >> /tmp/t.true_exec
  now; t0=$T; gpupass --version > /dev/null; now; echo $((T - t0)) >> /tmp/t.version_exec
  i=$((i + 1))
done
med() { sort -n /tmp/t.$1 | awk '{ v[NR] = $1 } END { printf "%d", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
CLOCK=$(med clock)
# ms, the clock's own cost taken off.
ms() { awk -v m="$(med "$1")" -v c="$CLOCK" 'BEGIN { printf "%.1f", (m - c) / 1000 }'; }
for c in $CONTENDERS clock true_exec version_exec; do
  echo "BENCH $c median_us=$(med $c) samples_us=$(tr '\n' ' ' < /tmp/t.$c)"
done
if [ $ok = 1 ]; then
  r() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
  fi=$(ms floor_idiom); fs=$(ms floor_strict); fp=$(ms floor_script); gp=$(ms gpupass_rt)
  lab_pass floor-idiom "$fi ms median per round trip: the writes, checks by \$(readlink), in this shell (N=$N)"
  lab_pass floor-strict "$fs ms: the writes, fork-free checks, in this shell (N=$N)"
  lab_pass floor-script "$fp ms: floor-strict as two busybox sh scripts (N=$N)"
  lab_pass gpupass "$gp ms: gpupass bind + unbind (N=$N); $(r "$gp" "$fi")x floor-idiom, $(r "$gp" "$fp")x floor-script, $(r "$gp" "$fs")x floor-strict"
  case $CONTENDERS in *driverctl_rt*)
    dc=$(ms driverctl_rt)
    lab_pass driverctl "$dc ms: driverctl set-override x2 + unset-override x2 (N=$N); gpupass takes $(r "$gp" "$dc")x driverctl's time"
  esac
  lab_pass exec "$(ms true_exec) ms /bin/true, $(ms version_exec) ms gpupass --version; clock read $(awk -v c="$CLOCK" 'BEGIN { printf "%.1f", c / 1000 }') ms, subtracted (15 each)"
fi
lab_expect end-drivers "bochs-drm snd_hda_intel" "$(drv $VGA) $(drv $HDA)"
