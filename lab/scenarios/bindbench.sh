# lab-about: benchmark: bind+unbind round trip of the 00:05.0+00:05.1 group, gpupass vs a plain shell doing the same sysfs writes
# lab-needs: gpupass
# lab-timeout: 300
# Not a timed test: it reports figures (LAB-RESULT ... PASS <numbers>) for docs/performance.md.
# Clock: /proc/uptime (10 ms ticks) over N rounds. Under TCG everything, the kernel's own
# driver probe/remove included, runs emulated, so absolute numbers are far above real hardware;
# the ratio to the floor is the useful figure.
N=${BENCH_N:-12}
VGA=0000:00:05.0
HDA=0000:00:05.1
D=/sys/bus/pci/devices
now() { cut -d' ' -f1 /proc/uptime; }
ms_per() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN { printf "%.1f", (b - a) * 1000 / n }'; }
drv() { basename "$(readlink $D/$1/driver)" 2>/dev/null; }

# The floor: exactly the writes gpupass makes, with the same driver checks, nothing else.
floor_round() {
  echo vfio-pci > $D/$HDA/driver_override; echo $HDA > /sys/bus/pci/drivers/snd_hda_intel/unbind
  echo $HDA > /sys/bus/pci/drivers_probe; [ "$(drv $HDA)" = vfio-pci ] || return 1
  echo vfio-pci > $D/$VGA/driver_override; echo $VGA > /sys/bus/pci/drivers/bochs-drm/unbind
  echo $VGA > /sys/bus/pci/drivers_probe; [ "$(drv $VGA)" = vfio-pci ] || return 1
  [ -c /dev/vfio/$(basename "$(readlink $D/$VGA/iommu_group)") ] || return 1
  echo > $D/$VGA/driver_override; echo $VGA > /sys/bus/pci/drivers/vfio-pci/unbind
  echo $VGA > /sys/bus/pci/drivers_probe; [ "$(drv $VGA)" = bochs-drm ] || return 1
  echo > $D/$HDA/driver_override; echo $HDA > /sys/bus/pci/drivers/vfio-pci/unbind
  echo $HDA > /sys/bus/pci/drivers_probe; [ "$(drv $HDA)" = snd_hda_intel ] || return 1
}
gpupass_round() {
  gpupass bind 00:05.0 > /dev/null && gpupass unbind 00:05.0 > /dev/null
}

# snd_hda_intel probes at most SNDRV_CARDS (32) times per boot (a static counter in azx_probe
# that remove never decrements): after that drivers_probe "succeeds" and binds nothing. So
# this scenario runs in its own boot and keeps the HDA reprobes under 32: one warm-up, then N
# alternating rounds of each (2N+2 reprobes).
floor_round || lab_fail floor-warmup "$(drv $VGA) $(drv $HDA)"
tf=0; tg=0; i=0; okk=1
while [ $i -lt $N ]; do
  t0=$(now); floor_round || { okk=0; break; }
  t1=$(now); gpupass_round || { okk=0; break; }
  t2=$(now)
  tf=$(awk -v s="$tf" -v a="$t0" -v b="$t1" 'BEGIN { print s + b - a }')
  tg=$(awk -v s="$tg" -v a="$t1" -v b="$t2" 'BEGIN { print s + b - a }')
  i=$((i + 1))
done
if [ $okk = 1 ]; then
  lab_pass floor-round-trip "$(ms_per 0 "$tf" "$N") ms per bind+unbind round trip, plain shell writes + checks (N=$N)"
  lab_pass gpupass-round-trip "$(ms_per 0 "$tg" "$N") ms per gpupass bind + gpupass unbind (N=$N)"
else
  lab_fail round-trip "round $i failed: $(drv $VGA) $(drv $HDA)"
fi

# Where gpupass's time goes: one inventory scan, a plan, an empty command.
t0=$(now); i=0; while [ $i -lt $N ]; do gpupass list --all > /dev/null; i=$((i + 1)); done; t1=$(now)
lab_pass scan "$(ms_per "$t0" "$t1" "$N") ms per gpupass list --all (inventory scan)"
t0=$(now); i=0; while [ $i -lt $N ]; do gpupass bind --dry-run 00:05.0 > /dev/null; i=$((i + 1)); done; t1=$(now)
lab_pass plan "$(ms_per "$t0" "$t1" "$N") ms per gpupass bind --dry-run (scan + in-use checks + plan)"
t0=$(now); i=0; while [ $i -lt $N ]; do gpupass --version > /dev/null; i=$((i + 1)); done; t1=$(now)
lab_pass exec "$(ms_per "$t0" "$t1" "$N") ms per gpupass --version (process start)"
lab_expect end-drivers "bochs-drm snd_hda_intel" "$(drv $VGA) $(drv $HDA)"
if command -v driverctl > /dev/null 2>&1; then lab_pass driverctl "present"; else
  lab_pass driverctl-absent "driverctl is a bash script and the lab guest is busybox-only: no driverctl figures"
fi
