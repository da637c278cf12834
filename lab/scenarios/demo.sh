# lab-about: the whole job on the real kernel: inventory + check, bind the VGA+audio group (plan, then the move), libvirt XML + QEMU args, boot it through VFIO in nested KVM, an mbochs mdev, a CDI spec, unbind to the drivers it had; a summary table with times
# lab-needs: gpupass
# lab-timeout: 240
# lab-steps: list groups show group-shared check bind-plan bind-plan-changes-nothing bind
# lab-steps: bind-drivers bind-node xml-hostdev xml-hostdevs qemu-args qemu-args-0000:00:05.0
# lab-steps: qemu-args-0000:00:05.1 boot-vfio boot-dev boot-dispi mdev-types mdev-create
# lab-steps: mdev-list mdev-listed cdi cdi-0000:00:05.0 cdi-group-* cdi-9d1b3f4a-*
# lab-steps: mdev-remove mdev-removed unbind drivers-restored overrides-restored unbind-node
# lab-steps: as-found mdevs-as-found summary
#
# The README's main job (`lab/lab.sh demo`). Each numbered step prints what to look at, runs
# the gpupass commands a user would type, and reports LAB-RESULT lines like any scenario; the
# console ends with one summary table (step, PASS/FAIL, time). The demo leaves the guest as it
# found it (drivers, overrides, mdevs): other scenarios run after it in the same boot.

VGA=0000:00:05.0   # std VGA (bochs-drm), the "GPU"
HDA=0000:00:05.1   # ICH9 HDA (snd_hda_intel), its "HDMI audio", same IOMMU group
MDEV=9d1b3f4a-2c6e-4d8f-a0b1-c2d3e4f5a6b7
T_BOOT=120         # gpupass boot --timeout: nested KVM under TCG is slow
G=$(lab_group $VGA)

# ---- timing: microseconds from busybox adjtimex (as bindbench.sh); /proc/uptime (10 ms) without
# it. Leaves the value in T (no subshell).
now() {
  if adjtimex > adj.tmp 2>/dev/null; then
    while read -r _k _v _r; do
      case $_k in time.tv_sec:) _ts=$_v ;; time.tv_usec:) _tu=$_v ;; esac
    done < adj.tmp
    _tu=${_tu#"${_tu%%[!0]*}"}
    T=$((_ts * 1000000 + ${_tu:-0}))
  else
    read -r _up _r < /proc/uptime
    _cs=${_up#*.}; _cs=${_cs#0}
    T=$((${_up%.*} * 1000000 + ${_cs:-0} * 10000))
  fi
}
# fmt_us US: "812 ms" below 10 s, "12.3 s" above
fmt_us() {
  _ms=$(($1 / 1000))
  if [ $_ms -lt 10000 ]; then echo "$_ms ms"; else echo "$((_ms / 1000)).$((_ms % 1000 / 100)) s"; fi
}

# ---- steps: one summary row each; a step fails when any of its results fails.
ROWS=summary.rows
: > $ROWS
NSTEP=0 STEP_TITLE='' STEP_FAILS=0 FAILS=0
lab_fail() {
  STEP_FAILS=$((STEP_FAILS + 1)) FAILS=$((FAILS + 1))
  _fs=$1; shift; lab_result "$_fs" FAIL "$@"
}
step() { # TITLE (the summary's row) WHAT (the heading) LOOK-AT
  step_end
  NSTEP=$((NSTEP + 1)) STEP_TITLE=$1 STEP_FAILS=0
  echo
  echo "======================================================================"
  echo "== $NSTEP. $2"
  echo "   look at: $3"
  echo "======================================================================"
  now; STEP_T0=$T
}
step_end() {
  [ -n "$STEP_TITLE" ] || return 0
  now
  if [ $STEP_FAILS = 0 ]; then _r=PASS; else _r=FAIL; fi
  echo "$NSTEP|$STEP_TITLE|$_r|$((T - STEP_T0))" >> $ROWS
  STEP_TITLE=''
}

# show STEP NAME MAX CMD...: lab_run, but at most MAX lines of stdout on the console (all of it
# is shipped as NAME to target/lab/out*/demo/).
show() {
  _ss=$1 _sn=$2 _sm=$3; shift 3
  echo "\$ $*"
  "$@" > "$_sn" 2> "$_sn.stderr"
  _src=$?
  head -n "$_sm" "$_sn"
  _sl=$(wc -l < "$_sn")
  [ "$_sl" -gt "$_sm" ] && echo "   [... $((_sl - _sm)) more lines in $_sn, shipped to the host]"
  cat "$_sn.stderr"
  lab_file "$_sn" "$_sn"
  [ -s "$_sn.stderr" ] && lab_file "$_sn.stderr" "$_sn.stderr"
  if [ $_src = 0 ]; then lab_pass "$_ss" "$*"; else lab_fail "$_ss" "rc=$_src $* :: $(tail -1 "$_sn.stderr")"; fi
  return $_src
}

drivers() { echo "$(lab_driver $VGA) $(lab_driver $HDA)"; }
overrides() { echo "$(cat /sys/bus/pci/devices/$VGA/driver_override) $(cat /sys/bus/pci/devices/$HDA/driver_override)"; }
mdevs() { ls /sys/bus/mdev/devices 2>/dev/null | tr '\n' ' '; }
print_drivers() { # LABEL
  printf '   %-7s %s %-14s %s %s\n' "$1" $VGA "$(lab_driver $VGA)" $HDA "$(lab_driver $HDA)"
}

# The state the demo must leave behind.
now; T_START=$T
gpupass list --all > as-found.txt 2>&1
DRIVERS0=$(drivers) OVERRIDES0=$(overrides) MDEVS0=$(mdevs)

# ---------------------------------------------------------------------------------------------
step "inventory: list, groups, show" "inventory: gpupass list, groups, show $VGA" \
  "the GPUs with their drivers; IOMMU group $G holding $VGA (VGA) and $HDA (audio); 'show' names both"
show list list.txt 40 gpupass list
echo
show groups groups.txt 40 gpupass groups
echo
show show show.txt 60 gpupass show $VGA
lab_expect group-shared "$G" "$(lab_group $HDA)"

step "check: host ready for passthrough" "gpupass check: is this host ready for passthrough?" \
  "IOMMU on, interrupt remapping, vfio modules, /dev/vfio/vfio; exit 0 = ready"
show check check.txt 40 gpupass check

step "bind --dry-run: the plan" "bind, the plan first: gpupass bind --dry-run $VGA" \
  "the exact ordered sysfs writes for both functions of group $G; nothing changes"
print_drivers before
show bind-plan bind-plan.txt 40 gpupass bind --dry-run $VGA
lab_expect bind-plan-changes-nothing "$DRIVERS0" "$(drivers)"

step "bind: group $G to vfio-pci" "bind, the move: gpupass bind $VGA" \
  "$VGA and its audio companion $HDA both move to vfio-pci; /dev/vfio/$G appears"
print_drivers before
show bind bind.txt 40 gpupass bind $VGA
print_drivers after
lab_expect bind-drivers "vfio-pci vfio-pci" "$(drivers)"
if [ -c /dev/vfio/$G ]; then lab_pass bind-node "/dev/vfio/$G"; else lab_fail bind-node "no /dev/vfio/$G"; fi

step "xml hostdev + qemu-args" "VM config: libvirt <hostdev> and QEMU arguments for $VGA" \
  "one <hostdev> / one vfio-pci device per function of the group, the audio function included"
show xml-hostdev hostdev.xml 40 gpupass xml hostdev $VGA
lab_expect xml-hostdevs 2 "$(grep -c '<hostdev ' hostdev.xml)"
echo
show qemu-args qemu-args.txt 40 gpupass qemu-args $VGA
for f in $VGA $HDA; do
  if grep -q "host=$f" qemu-args.txt; then lab_pass "qemu-args-$f" "vfio-pci host=$f"; else lab_fail "qemu-args-$f" "no vfio-pci host=$f"; fi
done

step "boot --device: BARs through VFIO" "boot: gpupass boot --device $VGA (a KVM guest, nested)" \
  "the firmware in a KVM guest sees 1234:1111 and reads the Bochs dispi id 0xb0c5 through VFIO"
show boot-vfio boot.txt 40 gpupass boot --device $VGA --timeout $T_BOOT
lab_expect boot-dev "1234:1111" "$(grep "^FW dev 00:01.0" boot.txt | cut -d" " -f4)"
lab_expect boot-dispi "FW dispi 00:01.0 0xb0c5" "$(grep '^FW dispi' boot.txt)"

step "mdev create + list (mbochs)" "mdev: an mbochs vGPU instance, created and listed" \
  "the instance's UUID, parent mbochs, type mbochs-small, its own IOMMU group and /dev/vfio node"
show mdev-types mdev-types.txt 20 gpupass mdev types --parent mbochs
echo
show mdev-create mdev-create.txt 5 gpupass mdev create --parent mbochs --type mbochs-small --uuid $MDEV
echo
show mdev-list mdev-list.txt 10 gpupass mdev list
lab_expect mdev-listed 1 "$(grep -c "$MDEV" mdev-list.txt)"

step "cdi generate" "CDI: gpupass cdi generate (for podman, containerd, CRI-O)" \
  "devices named by PCI address, group-$G and the mdev UUID, each with the nodes a VMM opens (/dev/vfio/N; /dev/iommu + /dev/vfio/devices/vfioN with iommufd)"
show cdi cdi.json 80 gpupass cdi generate
for n in "$VGA" "group-$G" "$MDEV"; do
  if grep -q "\"name\": \"$n\"" cdi.json; then lab_pass "cdi-$n" "device $n"; else lab_fail "cdi-$n" "no device named $n"; fi
done

step "mdev remove" "mdev remove: gpupass mdev remove $MDEV" \
  "the instance and its /dev/vfio node are gone"
show mdev-remove mdev-remove.txt 5 gpupass mdev remove $MDEV
if [ -e /sys/bus/mdev/devices/$MDEV ]; then
  lab_fail mdev-removed "$MDEV still there; removed through sysfs"
  echo 1 > /sys/bus/mdev/devices/$MDEV/remove
else
  lab_pass mdev-removed "$MDEV gone"
fi

step "unbind: drivers back as they were" "unbind: gpupass unbind $VGA" \
  "both functions back on the drivers they had before the bind, overrides cleared"
print_drivers before
show unbind unbind.txt 40 gpupass unbind $VGA
print_drivers after
lab_expect drivers-restored "$DRIVERS0" "$(drivers)"
lab_expect overrides-restored "$OVERRIDES0" "$(overrides)"
if [ -e /dev/vfio/$G ]; then lab_fail unbind-node "/dev/vfio/$G still there"; else lab_pass unbind-node "/dev/vfio/$G gone"; fi
# Should gpupass have failed, put the drivers back by hand for the scenarios after this one.
if [ "$(drivers)" != "$DRIVERS0" ]; then
  for f in $VGA $HDA; do
    echo > /sys/bus/pci/devices/$f/driver_override
    [ -n "$(lab_driver $f)" ] && echo $f > "/sys/bus/pci/drivers/$(lab_driver $f)/unbind"
    echo $f > /sys/bus/pci/drivers_probe
  done
fi
# The guest as found: every function's driver and group, and no mdev left.
gpupass list --all > as-left.txt 2>&1
if cmp -s as-found.txt as-left.txt; then
  lab_pass as-found "gpupass list --all is the same before and after the demo"
else
  lab_fail as-found "$(diff as-found.txt as-left.txt | grep '^[-+][^-+]' | head -4 | tr '\n' '|')"
fi
lab_expect mdevs-as-found "$MDEVS0" "$(mdevs)"
step_end

# ---------------------------------------------------------------------------------------------
now; TOTAL=$((T - T_START))
{
  echo
  echo "=================== gpupass demo on $(uname -r) ==================="
  printf '%3s  %-40s %-6s %9s\n' '#' step result time
  while IFS='|' read -r n title r us; do
    printf '%3s  %-40s %-6s %9s\n' "$n" "$title" "$r" "$(fmt_us "$us")"
  done < $ROWS
  if [ $FAILS = 0 ]; then r=PASS; else r=FAIL; fi
  printf '%3s  %-40s %-6s %9s\n' '' "total ($FAILS failed results)" "$r" "$(fmt_us $TOTAL)"
  echo "======================================================================"
} > summary.txt
cat summary.txt
lab_file summary.txt summary.txt
lab_result summary $r "$NSTEP steps, $FAILS failed results, $(fmt_us $TOTAL)"
