# lab-about: gpupass mdev on the real kernel's sample parents (mbochs/mdpy/mtty): types, create, in-use refusal, exhaustion, rollback, remove; mdevctl interop both ways; create+remove vs mdevctl start+stop timing. The guest runs the commands and ships their output, exit status and the sysfs facts; tests/it/labjudge/mdev.rs judges them
# lab-needs: gpupass
# lab-files: /usr/bin/mdevctl
# lab-timeout: 240
# lab-judge: rust
#
# Judged in Rust (docs/lab.md, "Judged scenarios"): this script decides nothing. Each command
# runs under `lab_cmd NAME` (NAME.out, NAME.err, NAME.rc shipped); what the kernel says (sysfs
# devices, available_instances, /dev/vfio nodes) is shipped as NAME.facts, read here without
# gpupass. The steps and what each asserts are the judge's (`tests/it/labjudge/mdev.rs`).
#
# `lab-files` asks the runner to copy these host binaries (and the shared libraries `ldd`
# names) into the initramfs; Debian's mdevctl is dynamically linked (libc, libgcc_s).
# Without it the interop and benchmark steps FAIL saying so; they never pass silently.

MB=/sys/class/mdev_bus
LARGE=$MB/mbochs/mdev_supported_types/mbochs-large/available_instances
BENCH_N=${BENCH_N:-20}

# wait_for PATH: up to ~2 s for a node that devtmpfs creates asynchronously.
wait_for() { _i=0; while [ ! -e "$1" ] && [ $_i -lt 20 ]; do sleep 0.1; _i=$((_i + 1)); done; [ -e "$1" ]; }
# centiseconds since boot (busybox date has no %N)
now_cs() { read -r _u _ < /proc/uptime; echo "${_u%.*}${_u#*.}"; }
mdev_group() { _l=$(readlink "/sys/bus/mdev/devices/$1/iommu_group" 2>/dev/null) && basename "$_l"; }
present() { if [ -e "$1" ]; then echo present; else echo absent; fi; }
count() { ls /sys/bus/mdev/devices | wc -l; }

# 1. types: the virtual parents come from /sys/class/mdev_bus
lab_cmd types gpupass mdev types
lab_cmd types-json gpupass mdev types --json
# What the kernel says, for the record.
for t in "$MB"/*/mdev_supported_types/*; do
  echo "$(basename "$(dirname "$(dirname "$t")")") $(basename "$t") avail=$(cat "$t/available_instances") api=$(cat "$t/device_api") name=$(cat "$t/name" 2>/dev/null)"
done > kernel-types.txt
lab_file kernel-types.txt kernel-types.txt
large_avail=$(cat $LARGE)
lab_facts start "large.available=$large_avail"
lab_cmd types-mbochs gpupass mdev types --parent mbochs --json

# 2. create an mbochs instance: sysfs device, IOMMU group, /dev/vfio/N
lab_cmd create gpupass mdev create --parent mbochs --type mbochs-large
U=$(cat create.out)
G=$(mdev_group "$U")
if [ -n "$U" ] && [ -n "$G" ]; then wait_for "/dev/vfio/$G"; fi
lab_facts create "uuid=$U" "sysfs=$(present "/sys/bus/mdev/devices/$U")" "group=$G" \
  "node=$(if [ -n "$G" ] && [ -c "/dev/vfio/$G" ]; then echo char; else echo absent; fi)"
if [ -n "$U" ] && [ -d "/sys/bus/mdev/devices/$U" ]; then
  lab_cmd list gpupass mdev list --json

  # 3. in use: a process holding /dev/vfio/G open makes remove refuse and change nothing
  sleep 60 < "/dev/vfio/$G" &
  HOLDER=$!
  sleep 0.2
  lab_cmd remove-in-use gpupass mdev remove "$U"
  lab_facts remove-in-use "sysfs=$(present "/sys/bus/mdev/devices/$U")" "holder.pid=$HOLDER"
  lab_cmd list-busy gpupass mdev list --json
  kill $HOLDER; wait $HOLDER 2>/dev/null
fi

# 4. exhaust mbochs-large, get the clear error; the kernel agrees there is none left
left=$(cat $LARGE)
if [ "$left" -gt 0 ]; then
  lab_cmd exhaust-fill gpupass mdev create --parent mbochs --type mbochs-large --count "$left"
fi
before=$(count)
lab_cmd exhausted gpupass mdev create --parent mbochs --type mbochs-large
after=$(count)
if echo 11111111-2222-4333-8444-555555555555 > $MB/mbochs/mdev_supported_types/mbochs-large/create 2>/dev/null; then
  direct=accepted
  echo 1 > /sys/bus/mdev/devices/11111111-2222-4333-8444-555555555555/remove
else
  direct=refused
fi
lab_facts exhausted "left=$left" "before=$before" "after=$after" "direct-create=$direct"

# 5. remove: device, group node gone; available back. remove-N for the Nth instance created:
# remove-1 the first, then those exhaust-fill made.
n=0
for u in $U $(cat exhaust-fill.out 2>/dev/null); do
  n=$((n + 1))
  g=$(mdev_group "$u")
  lab_cmd "remove-$n" gpupass mdev remove "$u"
  sleep 0.1
  lab_facts "remove-$n" "uuid=$u" "group=$g" "sysfs=$(present "/sys/bus/mdev/devices/$u")" \
    "node=$(if [ -n "$g" ]; then present "/dev/vfio/$g"; else echo '(no group)'; fi)"
done
lab_facts removed "instances=$n" "large.available=$(cat $LARGE)"

# 6. errors that change nothing
n0=$(count)
lab_cmd unknown-parent gpupass mdev create --parent mbosch --type mbochs-small
lab_cmd unknown-type gpupass mdev create --parent mdpy --type mdpy-4k
lab_cmd malformed-uuid gpupass mdev create --parent mbochs --type mbochs-small --uuid 1234
# an attribute the device does not have: created, then removed again
lab_cmd attr-rollback gpupass mdev create --parent mtty --type mtty-1 --attr no_such_attr=1
lab_facts errors "before=$n0" "after=$(count)"

# 7. mdevctl interop, both ways
UA=aaaaaaaa-1111-4222-8333-444444444444
UB=bbbbbbbb-1111-4222-8333-444444444444
if ! command -v mdevctl > /dev/null; then
  lab_facts mdevctl "present=no"
else
  mkdir -p /etc/mdevctl.d/scripts.d/callouts /etc/mdevctl.d/scripts.d/notifiers \
    /usr/lib/mdevctl/scripts.d/callouts /usr/lib/mdevctl/scripts.d/notifiers
  lab_facts mdevctl "present=yes" "version=$(mdevctl --version 2>&1 | head -1)" "ua=$UA" "ub=$UB"
  lab_cmd gpupass-define gpupass mdev define --parent mdpy --type mdpy-vga --uuid $UA --auto --attr x=1
  lab_cmd mdevctl-defined mdevctl list --defined
  lab_cmd mdevctl-define mdevctl define --uuid $UB --parent mtty --type mtty-2
  lab_cmd gp-defined gpupass mdev list --defined --json
  lab_cmd gpupass-start gpupass mdev start $UB
  lab_facts gpupass-start "sysfs=$(present /sys/bus/mdev/devices/$UB)"
  lab_cmd mdevctl-active mdevctl list
  lab_cmd mdevctl-stop mdevctl stop --uuid $UB
  lab_facts mdevctl-stop "sysfs=$(present /sys/bus/mdev/devices/$UB)"
  # The attribute x does not exist on mdpy: mdevctl's own start would fail the same way.
  # Auto-start without attributes instead:
  gpupass mdev undefine $UA > /dev/null
  gpupass mdev define --parent mdpy --type mdpy-vga --uuid $UA --auto > /dev/null
  lab_cmd start-auto-all gpupass mdev start --auto-all
  lab_facts start-auto-all "sysfs=$(present /sys/bus/mdev/devices/$UA)"
  gpupass mdev stop $UA > /dev/null 2>&1
  mdevctl undefine --uuid $UA; mdevctl undefine --uuid $UB
  lab_cmd undefine-both gpupass mdev list --defined --json

  # 8. benchmark: same type, same UUID, one process per step for both tools; the exit status of
  # every one is counted (failed=), the judge wants none.
  UC=cccccccc-1111-4222-8333-444444444444
  t0=$(now_cs); i=0; failed=0
  while [ $i -lt "$BENCH_N" ]; do
    gpupass mdev create --parent mbochs --type mbochs-small --uuid $UC > /dev/null 2>&1 || failed=$((failed + 1))
    gpupass mdev remove $UC > /dev/null 2>&1 || failed=$((failed + 1))
    i=$((i + 1))
  done
  t1=$(now_cs); i=0
  while [ $i -lt "$BENCH_N" ]; do
    mdevctl start --uuid $UC --parent mbochs --type mbochs-small > /dev/null 2>&1 || failed=$((failed + 1))
    mdevctl stop --uuid $UC > /dev/null 2>&1 || failed=$((failed + 1))
    i=$((i + 1))
  done
  t2=$(now_cs)
  gp=$(((t1 - t0) * 10 / BENCH_N)); mc=$(((t2 - t1) * 10 / BENCH_N))
  echo "n=$BENCH_N gpupass_create_remove_ms=$gp mdevctl_start_stop_ms=$mc (guest under QEMU TCG, /proc/uptime resolution 10 ms)" > bench.txt
  lab_file bench.txt bench.txt
  lab_facts bench "n=$BENCH_N" "commands=$((BENCH_N * 4))" "failed=$failed" "gpupass_create_remove_ms=$gp" "mdevctl_start_stop_ms=$mc"
fi
