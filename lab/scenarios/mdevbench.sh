# lab-about: benchmark: mdev create+remove of an mbochs-small instance, gpupass vs Debian's mdevctl start+stop, interleaved round by round, microsecond clock
# lab-needs: gpupass
# lab-files: /usr/bin/mdevctl
# lab-timeout: 600
# lab-steps: parent gpupass mdevctl ratio def-gpupass def-mdevctl def-ratio end-clean
# Not a timed test: it reports figures (LAB-RESULT ... PASS <numbers>) for docs/performance.md.
#
# One pair: create the mdev (sysfs `create` on mbochs's mbochs-small type) and remove it, one
# process per step, for both tools, with the same UUID:
#   gpupass   gpupass mdev create --parent mbochs --type mbochs-small --uuid U; gpupass mdev remove U
#   mdevctl   mdevctl start --uuid U --parent mbochs --type mbochs-small; mdevctl stop --uuid U
# ROUNDS rounds; in each, N pairs of gpupass then N pairs of mdevctl (the order alternates from
# round to round). Clock: busybox adjtimex (microseconds; reading it costs a process, the same
# for both). Figures: ms per pair per round, the medians, and their ratio. Everything runs
# under QEMU TCG: absolute figures are far above hardware, the ratio is the result.
#
# Then the persistent path the same way (steps def-*), one cycle per process per step:
#   gpupass   mdev define --parent mbochs --type mbochs-small --uuid U; mdev start U; mdev stop U;
#             mdev undefine U
#   mdevctl   define --uuid U --parent mbochs --type mbochs-small; start --uuid U; stop --uuid U;
#             undefine --uuid U
ROUNDS=${BENCH_ROUNDS:-5}
N=${BENCH_N:-10}
U=dddddddd-1111-4222-8333-444444444444
T_DIR=/sys/class/mdev_bus/mbochs/mdev_supported_types/mbochs-small

# now (lab/guest/lib.sh): T = the clock in microseconds.
now() { lab_now_us; }
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

if [ -d $T_DIR ]; then lab_pass parent "mbochs-small: $(cat $T_DIR/available_instances) available"; else lab_fail parent "no $T_DIR"; fi
have_mdevctl=1
command -v mdevctl > /dev/null 2>&1 || have_mdevctl=0
# What Debian's mdevctl package creates on a real system (its config and callout dirs).
mkdir -p /etc/mdevctl.d/scripts.d/callouts /etc/mdevctl.d/scripts.d/notifiers /usr/lib/mdevctl/scripts.d/callouts /usr/lib/mdevctl/scripts.d/notifiers

# A failed step is kept (its stderr, once) in gp.err / mc.err, and fails the contender's step.
: > gp.err; : > mc.err
pairs_gpupass() {
  i=0
  while [ $i -lt $N ]; do
    gpupass mdev create --parent mbochs --type mbochs-small --uuid $U > /dev/null 2>> gp.err || echo "create failed (pair $i)" >> gp.err
    gpupass mdev remove $U > /dev/null 2>> gp.err || echo "remove failed (pair $i)" >> gp.err
    i=$((i + 1))
  done
}
pairs_mdevctl() {
  i=0
  while [ $i -lt $N ]; do
    mdevctl start --uuid $U --parent mbochs --type mbochs-small > /dev/null 2>> mc.err || echo "start failed (pair $i)" >> mc.err
    mdevctl stop --uuid $U > /dev/null 2>> mc.err || echo "stop failed (pair $i)" >> mc.err
    i=$((i + 1))
  done
}
# time_pairs FN: microseconds per pair of FN, in P.
time_pairs() { now; t0=$T; $1; now; P=$(( (T - t0) / N )); }

gp='' mc='' r=1
while [ $r -le $ROUNDS ]; do
  if [ $((r % 2)) = 1 ]; then order="pairs_gpupass pairs_mdevctl"; else order="pairs_mdevctl pairs_gpupass"; fi
  for f in $order; do
    [ $f = pairs_mdevctl ] && [ $have_mdevctl = 0 ] && continue
    time_pairs $f
    case $f in pairs_gpupass) gp="$gp $((P / 1000))" ;; *) mc="$mc $((P / 1000))" ;; esac
  done
  r=$((r + 1))
done
gm=$(echo $gp | median)
if [ ! -s gp.err ]; then lab_pass gpupass "median $gm ms per pair (rounds:$gp) N=$N"; else lab_fail gpupass "$(head -3 gp.err | tr '\n' ' ') (rounds:$gp)"; fi
if [ $have_mdevctl = 1 ]; then
  mm=$(echo $mc | median)
  if [ ! -s mc.err ]; then lab_pass mdevctl "median $mm ms per pair (rounds:$mc) N=$N"; else lab_fail mdevctl "$(head -3 mc.err | tr '\n' ' ') (rounds:$mc)"; fi
  if [ ! -s gp.err ] && [ ! -s mc.err ]; then
    lab_pass ratio "gpupass/mdevctl = $gm/$mm = $(awk "BEGIN {printf \"%.2f\", $gm / $mm}")x"
  else
    lab_fail ratio "a contender failed: no ratio"
  fi
else
  lab_fail mdevctl "mdevctl is not in the guest (lab-files)"
  lab_fail ratio "no mdevctl"
fi
# The persistent path: define + start + stop (+ undefine, so that the next cycle can define).
: > gp.err; : > mc.err
pairs_gpupass() {
  i=0
  while [ $i -lt $N ]; do
    gpupass mdev define --parent mbochs --type mbochs-small --uuid $U > /dev/null 2>> gp.err || echo "define failed (cycle $i)" >> gp.err
    gpupass mdev start $U > /dev/null 2>> gp.err || echo "start failed (cycle $i)" >> gp.err
    gpupass mdev stop $U > /dev/null 2>> gp.err || echo "stop failed (cycle $i)" >> gp.err
    gpupass mdev undefine $U > /dev/null 2>> gp.err || echo "undefine failed (cycle $i)" >> gp.err
    i=$((i + 1))
  done
}
pairs_mdevctl() {
  i=0
  while [ $i -lt $N ]; do
    mdevctl define --uuid $U --parent mbochs --type mbochs-small > /dev/null 2>> mc.err || echo "define failed (cycle $i)" >> mc.err
    mdevctl start --uuid $U > /dev/null 2>> mc.err || echo "start failed (cycle $i)" >> mc.err
    mdevctl stop --uuid $U > /dev/null 2>> mc.err || echo "stop failed (cycle $i)" >> mc.err
    mdevctl undefine --uuid $U > /dev/null 2>> mc.err || echo "undefine failed (cycle $i)" >> mc.err
    i=$((i + 1))
  done
}
gp='' mc='' r=1
while [ $r -le $ROUNDS ] && [ $have_mdevctl = 1 ]; do
  if [ $((r % 2)) = 1 ]; then order="pairs_gpupass pairs_mdevctl"; else order="pairs_mdevctl pairs_gpupass"; fi
  for f in $order; do
    time_pairs $f
    case $f in pairs_gpupass) gp="$gp $((P / 1000))" ;; *) mc="$mc $((P / 1000))" ;; esac
  done
  r=$((r + 1))
done
if [ $have_mdevctl = 1 ]; then
  gm=$(echo $gp | median) mm=$(echo $mc | median)
  if [ ! -s gp.err ]; then lab_pass def-gpupass "median $gm ms per define+start+stop+undefine (rounds:$gp) N=$N"; else lab_fail def-gpupass "$(head -3 gp.err | tr '\n' ' ') (rounds:$gp)"; fi
  if [ ! -s mc.err ]; then lab_pass def-mdevctl "median $mm ms per define+start+stop+undefine (rounds:$mc) N=$N"; else lab_fail def-mdevctl "$(head -3 mc.err | tr '\n' ' ') (rounds:$mc)"; fi
  if [ ! -s gp.err ] && [ ! -s mc.err ]; then
    lab_pass def-ratio "gpupass/mdevctl = $gm/$mm = $(awk "BEGIN {printf \"%.2f\", $gm / $mm}")x"
  else
    lab_fail def-ratio "a contender failed: no ratio"
  fi
else
  lab_fail def-gpupass "no mdevctl to compare with"
  lab_fail def-mdevctl "mdevctl is not in the guest (lab-files)"
  lab_fail def-ratio "no mdevctl"
fi
lab_check end-clean sh -c "! test -e /sys/bus/mdev/devices/$U && ! ls /etc/mdevctl.d/*/$U 2> /dev/null | grep -q ."
