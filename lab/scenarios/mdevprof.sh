# lab-about: profile: where gpupass mdev create/remove spend their time (-vv JSON log phase timestamps, strace counts and timed traces, mdevctl's counts beside them); not a test
# lab-needs: gpupass
# lab-files: /usr/bin/strace /usr/bin/mdevctl
# lab-timeout: 300
# lab-steps: end-clean
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
echo "=== FAULTS create --dry-run"; gpupass -vv --log-format json mdev create --parent mbochs --type mbochs-small --uuid $U --dry-run 2>&1 >/dev/null | grep -o '"faults":[0-9]*' | head -3
ls -l "$(command -v gpupass)" "$(command -v mdevctl)"
echo "=== END"
lab_check end-clean test ! -e /sys/bus/mdev/devices/$U
