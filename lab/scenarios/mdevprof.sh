# lab-about: profile: where gpupass mdev create/remove/define/start/stop/undefine spend their time (-vv JSON log phase timestamps, strace counts and timed traces, per-command wall time, faults and system calls of both tools); not a test
# lab-needs: gpupass
# lab-files: /usr/bin/strace /usr/bin/mdevctl
# lab-timeout: 600
# lab-steps: percmd end-clean
# Prints, for docs/performance.md: the phase timestamps of three create+remove pairs (the JSON
# log's timestamps are microseconds; the phases are the debug lines of cli/mdev.rs), one
# `strace -c -f` per command of both tools, and one `strace -f -tt -T` of each gpupass command.
U=dddddddd-1111-4222-8333-444444444444
mkdir -p /etc/mdevctl.d/scripts.d/callouts /etc/mdevctl.d/scripts.d/notifiers /usr/lib/mdevctl/scripts.d/callouts /usr/lib/mdevctl/scripts.d/notifiers
echo "=== LOAD $(cat /proc/loadavg)"
i=0
while [ $i -lt 3 ]; do
  echo "=== PHASES create $i"
  gpupass -vv --log-format json mdev create --parent mbochs --type mbochs-small --uuid $U 2>&1 >/dev/null | cut -c1-220
  echo "=== PHASES remove $i"
  gpupass -vv --log-format json mdev remove $U 2>&1 >/dev/null | cut -c1-220
  i=$((i + 1))
done
echo "=== STRACE-C gpupass create"; strace -c -f -o /tmp/c.trace gpupass mdev create --parent mbochs --type mbochs-small --uuid $U > /dev/null; cat /tmp/c.trace
echo "=== STRACE-C gpupass remove"; strace -c -f -o /tmp/c.trace gpupass mdev remove $U > /dev/null; cat /tmp/c.trace
echo "=== STRACE-C mdevctl start"; strace -c -f -o /tmp/c.trace mdevctl start --uuid $U --parent mbochs --type mbochs-small > /dev/null; cat /tmp/c.trace
echo "=== STRACE-C mdevctl stop"; strace -c -f -o /tmp/c.trace mdevctl stop --uuid $U > /dev/null; cat /tmp/c.trace
strace -f -tt -T -o /tmp/create.trace gpupass mdev create --parent mbochs --type mbochs-small --uuid $U > /dev/null
strace -f -tt -T -o /tmp/remove.trace gpupass mdev remove $U > /dev/null
lab_file create.trace /tmp/create.trace
lab_file remove.trace /tmp/remove.trace
# The floor: what each part of a create+remove pair costs on its own, FN pairs of each, the
# microsecond clock (FLOOR lines: name, microseconds per pair). `sh` is the two sysfs writes from
# the shell itself (no process: the kernel's own create and remove); `true` two processes that
# do nothing; `version` two gpupass processes that parse their arguments and exit; `dry` a
# create plan printed (the reads, no write) plus a `--version`.
FN=${FLOOR_N:-20}
T_DIR=/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small
floor() {
  name=$1; shift
  lab_now_us; t0=$T
  i=0
  while [ $i -lt $FN ]; do "$@"; i=$((i + 1)); done
  lab_now_us
  echo "=== FLOOR $name $(( (T - t0) / FN )) us/pair"
}
f_sh() { echo $U > $T_DIR/create; echo 1 > /sys/bus/mdev/devices/$U/remove; }
f_true() { /bin/true; /bin/true; }
f_version() { gpupass --version > /dev/null; gpupass --version > /dev/null; }
f_mversion() { mdevctl --version > /dev/null; mdevctl --version > /dev/null; }
f_dry() { gpupass mdev create --parent mbochs --type mbochs-small --uuid $U --dry-run > /dev/null; gpupass --version > /dev/null; }
f_gp() { gpupass mdev create --parent mbochs --type mbochs-small --uuid $U > /dev/null; gpupass mdev remove $U > /dev/null; }
f_mc() { mdevctl start --uuid $U --parent mbochs --type mbochs-small > /dev/null; mdevctl stop --uuid $U > /dev/null; }
f_clock() { :; }
for k in 1 2; do
  floor clock f_clock
  floor sh f_sh
  floor true f_true
  floor version f_version
  floor mdevctl-version f_mversion
  floor dry f_dry
  floor gpupass f_gp
  floor mdevctl f_mc
done
# Per command, both tools, both paths (create+remove, define+start+stop+undefine): PN cycles
# of the six commands, alternating which tool goes first. One PERCMD line per command (tool,
# command, median µs, median minor faults, system calls, fsync+fdatasync, opens):
# - us: the microsecond clock read before and after the one command, the median of PN runs;
#   the clock's own cost (the `clock` line: two reads with nothing between) is in every figure;
# - faults: `busybox time -f %R` of the command (its minor page faults), the median of PN runs;
# - syscalls, fsync (fsync + fdatasync), opens (open + openat): one `strace -c -f` of the
#   command in a cycle of its own; the full summaries are the files strace-<tool>-<cmd>.txt.
# `gp` is gpupass, `mc` mdevctl; create/remove are mdevctl's start/stop with parent and type.
PN=${PERCMD_N:-10}
CMDS="create remove define start stop undefine"
argv() {
  case $1.$2 in
    gp.create) echo gpupass mdev create --parent mbochs --type mbochs-small --uuid $U ;;
    gp.remove) echo gpupass mdev remove $U ;;
    gp.define) echo gpupass mdev define --parent mbochs --type mbochs-small --uuid $U ;;
    gp.start) echo gpupass mdev start $U ;;
    gp.stop) echo gpupass mdev stop $U ;;
    gp.undefine) echo gpupass mdev undefine $U ;;
    mc.create) echo mdevctl start --uuid $U --parent mbochs --type mbochs-small ;;
    mc.remove) echo mdevctl stop --uuid $U ;;
    mc.define) echo mdevctl define --uuid $U --parent mbochs --type mbochs-small ;;
    mc.start) echo mdevctl start --uuid $U ;;
    mc.stop) echo mdevctl stop --uuid $U ;;
    mc.undefine) echo mdevctl undefine --uuid $U ;;
  esac
}
pmed() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
rm -f /tmp/pc.*
: > percmd.err
k=0
while [ $k -lt $PN ]; do
  lab_now_us; c0=$T; lab_now_us; echo $((T - c0)) >> /tmp/pc.us.clock
  if [ $((k % 2)) = 0 ]; then tools="gp mc"; else tools="mc gp"; fi
  for tool in $tools; do
    for c in $CMDS; do
      set -- $(argv $tool $c)
      lab_now_us; t0=$T
      "$@" > /dev/null 2>> percmd.err || echo "$tool $c failed (cycle $k)" >> percmd.err
      lab_now_us; echo $((T - t0)) >> /tmp/pc.us.$tool.$c
    done
    for c in $CMDS; do
      set -- $(argv $tool $c)
      busybox time -f %R -o /tmp/pc.f "$@" > /dev/null 2>> percmd.err
      tail -1 /tmp/pc.f >> /tmp/pc.faults.$tool.$c
    done
  done
  k=$((k + 1))
done
: > percmd.txt
echo "=== PERCMD clock us=$(pmed < /tmp/pc.us.clock) (two clock reads, nothing between) PN=$PN" | tee -a percmd.txt
for tool in gp mc; do
  for c in $CMDS; do
    set -- $(argv $tool $c)
    strace -c -f -o /tmp/pc.strace "$@" > /dev/null 2>> percmd.err
    cp /tmp/pc.strace strace-$tool-$c.txt
    lab_file strace-$tool-$c.txt strace-$tool-$c.txt
    sc=$(awk '$NF == "total" {print $4}' /tmp/pc.strace)
    fs=$(awk '$NF == "fsync" || $NF == "fdatasync" {s += $4} END {print s + 0}' /tmp/pc.strace)
    op=$(awk '$NF == "open" || $NF == "openat" {s += $4} END {print s + 0}' /tmp/pc.strace)
    echo "=== PERCMD $tool $c us=$(pmed < /tmp/pc.us.$tool.$c) faults=$(pmed < /tmp/pc.faults.$tool.$c) syscalls=$sc fsync=$fs opens=$op" | tee -a percmd.txt
  done
done
for c in define start stop undefine; do
  set -- $(argv gp $c)
  strace -f -tt -T -o /tmp/pc.trace "$@" > /dev/null 2>> percmd.err
  cp /tmp/pc.trace $c.trace
  lab_file $c.trace $c.trace
done
lab_file percmd.txt percmd.txt
if [ -s percmd.err ]; then lab_fail percmd "$(head -3 percmd.err | tr '\n' ' ')"; else lab_pass percmd "$(grep -c PERCMD percmd.txt) lines, PN=$PN"; fi
echo "=== FAULTS create --dry-run"; gpupass -vv --log-format json mdev create --parent mbochs --type mbochs-small --uuid $U --dry-run 2>&1 >/dev/null | grep -o '"faults":[0-9]*' | head -3
ls -l "$(command -v gpupass)" "$(command -v mdevctl)"
echo "=== END"
lab_check end-clean test ! -e /sys/bus/mdev/devices/$U
