# lab-about: gpupass mdev on the real kernel's sample parents (mbochs/mdpy/mtty): types, create, in-use refusal, exhaustion, rollback, remove; mdevctl interop both ways; create+remove vs mdevctl start+stop timing
# lab-needs: gpupass
# lab-files: /usr/bin/mdevctl
# lab-timeout: 240
# lab-steps: types types-json parent-mbochs parent-mdpy parent-mtty types-agree create
# lab-steps: sysfs-device vfio-node list list-shows remove-in-use-refused list-in-use
# lab-steps: exhausted-error kernel-agrees remove-*>=2 available-restored unknown-parent
# lab-steps: unknown-type malformed-uuid attr-rollback errors-changed-nothing mdevctl-present
# lab-steps: gpupass-define mdevctl-sees-gpupass-definition mdevctl-define
# lab-steps: gpupass-sees-mdevctl-definition gpupass-start-mdevctl-definition
# lab-steps: mdevctl-sees-gpupass-start mdevctl-stops-it start-auto-all undefine-both bench
#
# `lab-files` asks the runner to copy these host binaries (and the shared libraries `ldd`
# names) into the initramfs; Debian's mdevctl is dynamically linked (libc, libgcc_s).
# Without it the interop and benchmark steps FAIL saying so; they never pass silently.

MB=/sys/class/mdev_bus
BENCH_N=${BENCH_N:-20}

# wait_for PATH: up to ~2 s for a node that devtmpfs creates asynchronously.
wait_for() { _i=0; while [ ! -e "$1" ] && [ $_i -lt 20 ]; do sleep 0.1; _i=$((_i + 1)); done; [ -e "$1" ]; }
# centiseconds since boot (busybox date has no %N)
now_cs() { read -r _u _ < /proc/uptime; echo "${_u%.*}${_u#*.}"; }
mdev_group() { _l=$(readlink "/sys/bus/mdev/devices/$1/iommu_group" 2>/dev/null) && basename "$_l"; }

# 1. types: the virtual parents come from /sys/class/mdev_bus
lab_run types types.txt gpupass mdev types
lab_run types-json types.json gpupass mdev types --json
for p in mbochs mdpy mtty; do
  if grep -q "\"name\": \"$p\"" types.json; then lab_pass "parent-$p" "listed"; else lab_fail "parent-$p" "not in gpupass mdev types"; fi
done
# What the kernel says, for the record.
for t in "$MB"/*/mdev_supported_types/*; do
  echo "$(basename "$(dirname "$(dirname "$t")")") $(basename "$t") avail=$(cat "$t/available_instances") api=$(cat "$t/device_api") name=$(cat "$t/name" 2>/dev/null)"
done > kernel-types.txt
lab_file kernel-types.txt kernel-types.txt
large_avail=$(cat $MB/mbochs/mdev_supported_types/mbochs-large/available_instances)
lab_expect types-agree "$large_avail" "$(gpupass mdev types --parent mbochs | grep -A1 '^  mbochs-large$' | sed -n 's/.*Available instances: //p')"

# 2. create an mbochs instance: sysfs device, IOMMU group, /dev/vfio/N
if U=$(gpupass mdev create --parent mbochs --type mbochs-large 2>create.err); then
  lab_pass create "$U"
else
  lab_fail create "$(cat create.err)"
fi
if [ -n "$U" ] && [ -d "/sys/bus/mdev/devices/$U" ]; then
  G=$(mdev_group "$U")
  lab_pass sysfs-device "/sys/bus/mdev/devices/$U group ${G:-none}"
  if [ -n "$G" ] && wait_for "/dev/vfio/$G"; then lab_pass vfio-node "/dev/vfio/$G"; else lab_fail vfio-node "no /dev/vfio/${G:-?}"; fi
  lab_run list list.json gpupass mdev list --json
  if grep -q "\"instance\": \"$U\"" list.json && grep -q "\"vfio_node\": \"/dev/vfio/$G\"" list.json; then
    lab_pass list-shows "$U /dev/vfio/$G"
  else
    lab_fail list-shows "$U not listed with /dev/vfio/$G"
  fi

  # 3. in use: a process holding /dev/vfio/G open makes remove refuse and change nothing
  sleep 60 < "/dev/vfio/$G" &
  HOLDER=$!
  sleep 0.2
  gpupass mdev remove "$U" > inuse.out 2> inuse.err
  rc=$?
  if [ $rc = 1 ] && grep -q "is in use" inuse.err && [ -d "/sys/bus/mdev/devices/$U" ]; then
    lab_pass remove-in-use-refused "$(cat inuse.err)"
  else
    lab_fail remove-in-use-refused "rc=$rc $(cat inuse.err)"
  fi
  gpupass mdev list > list-busy.txt 2>&1
  if grep "$U" list-busy.txt | grep -q "yes: sleep (pid $HOLDER)"; then lab_pass list-in-use "sleep (pid $HOLDER)"; else lab_fail list-in-use "$(grep "$U" list-busy.txt)"; fi
  kill $HOLDER; wait $HOLDER 2>/dev/null
else
  lab_fail sysfs-device "no /sys/bus/mdev/devices/$U"
fi

# 4. exhaust mbochs-large, get the clear error; the kernel agrees there is none left
left=$(cat $MB/mbochs/mdev_supported_types/mbochs-large/available_instances)
EXTRA=""
if [ "$left" -gt 0 ]; then
  EXTRA=$(gpupass mdev create --parent mbochs --type mbochs-large --count "$left" 2>exhaust.err) ||
    lab_fail exhaust-fill "$(cat exhaust.err)"
fi
before=$(ls /sys/bus/mdev/devices | wc -l)
gpupass mdev create --parent mbochs --type mbochs-large > none.out 2> none.err
rc=$?
after=$(ls /sys/bus/mdev/devices | wc -l)
if [ $rc = 1 ] && grep -q "no available instances of mbochs-large on mbochs" none.err && [ "$before" = "$after" ]; then
  lab_pass exhausted-error "$(cat none.err)"
else
  lab_fail exhausted-error "rc=$rc before=$before after=$after $(cat none.err)"
fi
if echo 11111111-2222-4333-8444-555555555555 > $MB/mbochs/mdev_supported_types/mbochs-large/create 2>/dev/null; then
  lab_fail kernel-agrees "the kernel accepted a create with available_instances=0"
  echo 1 > /sys/bus/mdev/devices/11111111-2222-4333-8444-555555555555/remove
else
  lab_pass kernel-agrees "direct create refused by the kernel too"
fi

# 5. remove: device, group node gone; available back
for u in $U $EXTRA; do
  g=$(mdev_group "$u")
  if gpupass mdev remove "$u" > rm.out 2> rm.err && [ ! -e "/sys/bus/mdev/devices/$u" ]; then
    sleep 0.1
    if [ -n "$g" ] && [ -e "/dev/vfio/$g" ]; then lab_fail "remove-$u" "/dev/vfio/$g still there"; else lab_pass "remove-$u" "$(cat rm.out)"; fi
  else
    lab_fail "remove-$u" "$(cat rm.err)"
  fi
done
lab_expect available-restored "$large_avail" "$(cat $MB/mbochs/mdev_supported_types/mbochs-large/available_instances)"

# 6. errors that change nothing
n0=$(ls /sys/bus/mdev/devices | wc -l)
gpupass mdev create --parent mbosch --type mbochs-small > /dev/null 2> e1.err; rc=$?
if [ $rc = 1 ] && grep -q 'did you mean "mbochs"' e1.err; then lab_pass unknown-parent "$(cat e1.err)"; else lab_fail unknown-parent "rc=$rc $(cat e1.err)"; fi
gpupass mdev create --parent mdpy --type mdpy-4k > /dev/null 2> e2.err; rc=$?
if [ $rc = 1 ] && grep -q 'valid types: mdpy-hd, mdpy-vga, mdpy-xga' e2.err; then lab_pass unknown-type "$(cat e2.err)"; else lab_fail unknown-type "rc=$rc $(cat e2.err)"; fi
gpupass mdev create --parent mbochs --type mbochs-small --uuid 1234 > /dev/null 2> e3.err; rc=$?
if [ $rc = 2 ]; then lab_pass malformed-uuid "exit 2"; else lab_fail malformed-uuid "rc=$rc $(cat e3.err)"; fi
# an attribute the device does not have: created, then removed again
gpupass mdev create --parent mtty --type mtty-1 --attr no_such_attr=1 > /dev/null 2> e4.err; rc=$?
if [ $rc = 1 ] && grep -q 'the instance was removed again' e4.err; then lab_pass attr-rollback "$(cat e4.err)"; else lab_fail attr-rollback "rc=$rc $(cat e4.err)"; fi
lab_expect errors-changed-nothing "$n0" "$(ls /sys/bus/mdev/devices | wc -l)"

# 7. mdevctl interop, both ways
if ! command -v mdevctl > /dev/null; then
  lab_fail mdevctl-present "mdevctl is not in the guest: the lab runner must copy /usr/bin/mdevctl and its libraries (lab-files)"
else
  mkdir -p /etc/mdevctl.d/scripts.d/callouts /etc/mdevctl.d/scripts.d/notifiers \
    /usr/lib/mdevctl/scripts.d/callouts /usr/lib/mdevctl/scripts.d/notifiers
  lab_pass mdevctl-present "$(mdevctl --version 2>&1 | head -1)"
  UA=aaaaaaaa-1111-4222-8333-444444444444
  UB=bbbbbbbb-1111-4222-8333-444444444444
  lab_check gpupass-define gpupass mdev define --parent mdpy --type mdpy-vga --uuid $UA --auto --attr x=1
  mdevctl list --defined > mdevctl-defined.txt 2>&1
  lab_file mdevctl-defined.txt mdevctl-defined.txt
  if grep -q "$UA mdpy mdpy-vga auto" mdevctl-defined.txt; then lab_pass mdevctl-sees-gpupass-definition "$(grep $UA mdevctl-defined.txt)"; else lab_fail mdevctl-sees-gpupass-definition "$(cat mdevctl-defined.txt)"; fi
  lab_check mdevctl-define mdevctl define --uuid $UB --parent mtty --type mtty-2
  gpupass mdev list --defined > gp-defined.txt 2>&1
  if grep "$UB" gp-defined.txt | grep -q 'mtty-2  *manual'; then lab_pass gpupass-sees-mdevctl-definition "$(grep $UB gp-defined.txt)"; else lab_fail gpupass-sees-mdevctl-definition "$(cat gp-defined.txt)"; fi
  if gpupass mdev start $UB > st.out 2> st.err && [ -d /sys/bus/mdev/devices/$UB ]; then lab_pass gpupass-start-mdevctl-definition "$(cat st.out)"; else lab_fail gpupass-start-mdevctl-definition "$(cat st.err)"; fi
  mdevctl list > mdevctl-active.txt 2>&1
  if grep -q "$UB mtty mtty-2" mdevctl-active.txt; then lab_pass mdevctl-sees-gpupass-start "$(grep $UB mdevctl-active.txt)"; else lab_fail mdevctl-sees-gpupass-start "$(cat mdevctl-active.txt)"; fi
  if mdevctl stop --uuid $UB 2> ms.err && [ ! -e /sys/bus/mdev/devices/$UB ]; then lab_pass mdevctl-stops-it "gone"; else lab_fail mdevctl-stops-it "$(cat ms.err)"; fi
  # The attribute x does not exist on mdpy: mdevctl's own start would fail the same way.
  # Auto-start without attributes instead:
  gpupass mdev undefine $UA > /dev/null
  gpupass mdev define --parent mdpy --type mdpy-vga --uuid $UA --auto > /dev/null
  if gpupass mdev start --auto-all > aa.out 2>&1 && [ -d /sys/bus/mdev/devices/$UA ]; then lab_pass start-auto-all "$(cat aa.out)"; else lab_fail start-auto-all "$(cat aa.out)"; fi
  gpupass mdev stop $UA > /dev/null 2>&1
  mdevctl undefine --uuid $UA; mdevctl undefine --uuid $UB
  if [ -z "$(gpupass mdev list --defined --json | grep -e $UA -e $UB)" ]; then lab_pass undefine-both "gone"; else lab_fail undefine-both "still defined"; fi

  # 8. benchmark: same type, same UUID, one process per step for both tools
  UC=cccccccc-1111-4222-8333-444444444444
  t0=$(now_cs); i=0; ok=1
  while [ $i -lt "$BENCH_N" ]; do
    gpupass mdev create --parent mbochs --type mbochs-small --uuid $UC > /dev/null 2>&1 || ok=0
    gpupass mdev remove $UC > /dev/null 2>&1 || ok=0
    i=$((i + 1))
  done
  t1=$(now_cs); i=0
  while [ $i -lt "$BENCH_N" ]; do
    mdevctl start --uuid $UC --parent mbochs --type mbochs-small > /dev/null 2>&1 || ok=0
    mdevctl stop --uuid $UC > /dev/null 2>&1 || ok=0
    i=$((i + 1))
  done
  t2=$(now_cs)
  gp=$(( (t1 - t0) * 10 / BENCH_N )); mc=$(( (t2 - t1) * 10 / BENCH_N ))
  echo "n=$BENCH_N gpupass_create_remove_ms=$gp mdevctl_start_stop_ms=$mc (guest under QEMU TCG, /proc/uptime resolution 10 ms)" > bench.txt
  lab_file bench.txt bench.txt
  if [ $ok = 1 ]; then lab_pass bench "$(cat bench.txt)"; else lab_fail bench "a create/remove failed: $(cat bench.txt)"; fi
fi
