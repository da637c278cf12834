# lab-about: gpupass bind/unbind/recover/persist on the real kernel: VGA+HDA group 00:05.x, --only, boot VGA refusal, rollback at every write and crash after every write + recover, for bind and for unbind. The guest runs the commands and ships their output, exit status and the sysfs facts; the bind judge of tests/it/labjudge/ judges them
# lab-needs: gpupass
# lab-timeout: 300
# lab-judge: rust
#
# Judged in Rust (docs/lab.md, "Judged scenarios"): this script decides nothing. Each command
# runs under `lab_cmd NAME` (NAME.out, NAME.err, NAME.rc shipped) and is followed by
# `state NAME` (NAME.facts: the drivers, overrides and /dev/vfio node as sysfs and /dev show
# them, read here without gpupass). The steps and what each asserts are the judge's
# (the `bind` judge of tests/it/labjudge/; `labjudge steps bind` prints them).
#
# Real driver moves on the guest kernel (never on the host). 00:05.0 (VGA, bochs-drm) and
# 00:05.1 (ICH9 HDA, snd_hda_intel) share one IOMMU group, like a GPU and its HDMI audio.
VGA=0000:00:05.0
HDA=0000:00:05.1
BOOT=0000:00:02.0
BRIDGE=0000:00:08.0
G=$(lab_group $VGA)

# state NAME [KEY=VALUE...]: the group's drivers, overrides and node after a step.
state() {
  _st=$1; shift
  if [ -c "/dev/vfio/$G" ]; then _node=char; elif [ -e "/dev/vfio/$G" ]; then _node=other; else _node=absent; fi
  lab_facts "$_st" "vga.driver=$(lab_driver $VGA)" "hda.driver=$(lab_driver $HDA)" \
    "vga.override=$(cat /sys/bus/pci/devices/$VGA/driver_override)" \
    "hda.override=$(cat /sys/bus/pci/devices/$HDA/driver_override)" "node=$_node" "$@"
}
# step NAME CMD...: run CMD as NAME, then its state.
step() { lab_cmd "$@"; _r=$?; state "$1"; return $_r; }
# file_fact PATH: a file's content, or (absent).
file_fact() { if [ -e "$1" ]; then cat "$1"; else echo '(absent)'; fi; }

state start "vga.group=$G" "hda.group=$(lab_group $HDA)" "bootvga.driver=$(lab_driver $BOOT)" \
  "bridge.driver=$(lab_driver $BRIDGE)"

# 1. The plan, as --dry-run --json prints it; nothing changes.
step dry-run gpupass bind --dry-run --json 00:05.0

# 2. Naming one function binds the group; both on vfio-pci, /dev/vfio/G, viable.
step bind gpupass bind --json 00:05.0
lab_cmd bind-groups gpupass groups --json
step bind-again gpupass bind 00:05.1

# 3. Unbind restores the drivers gpupass recorded; the group node goes away.
step unbind gpupass unbind --json 00:05.0

# 4. --only: said up front that the group will not be viable, and which member blocks it.
step only gpupass bind --only 00:05.0
lab_cmd only-groups gpupass groups --json
step only-unbind gpupass unbind --json 00:05.0

# 5. The boot VGA with the framebuffer console is refused without --force.
ls -l /sys/class/graphics/ /sys/class/vtconsole/ > consoles.txt 2>&1
for v in /sys/class/vtconsole/*; do echo "$v $(cat $v/name) bind=$(cat $v/bind)"; done >> consoles.txt
for f in /sys/class/graphics/fb*; do echo "$f -> $(readlink -f $f/device)"; done >> consoles.txt
lab_file consoles.txt consoles.txt
lab_cmd bootvga gpupass bind 00:02.0
state bootvga "bootvga.driver=$(lab_driver $BOOT)"
lab_cmd bootvga-force-dry-run gpupass bind --force --dry-run --json 00:02.0
state bootvga-force-dry-run "bootvga.driver=$(lab_driver $BOOT)"

# The failpoint loops run once per write of the --dry-run plan (its "kind": "write" steps), so
# they cover every write the plan has; the judge counts the writes from the JSON itself.
writes() { grep -c -e '"kind": "write"' -e '"kind": "write_file"' -e '"kind": "remove_file"' "$1"; }

# fail_loop VERB COUNT PREFIX: a failing write at every position of `gpupass VERB 00:05.0`
# (PREFIX-N), then the state.
fail_loop() {
  n=1
  while [ $n -le "$2" ]; do
    step "$3-$n" env GPUPASS_FAIL_WRITE=$n gpupass "$1" 00:05.0
    n=$((n + 1))
  done
}
# crash_loop VERB COUNT PREFIX: a crash after every write of `gpupass VERB 00:05.0` (PREFIX-N,
# its state), the next command (PREFIX-N.list: it warns), `recover` (PREFIX-N.recover, the state).
crash_loop() {
  n=1
  while [ $n -le "$2" ]; do
    step "$3-$n" env GPUPASS_CRASH_AFTER_WRITE=$n gpupass "$1" 00:05.0
    lab_cmd "$3-$n.list" gpupass list
    step "$3-$n.recover" gpupass recover
    n=$((n + 1))
  done
}

# 6. Rollback: a failing write at every position leaves everything as it was.
fail_loop bind "$(writes dry-run.out)" rollback

# 7. Crash after each write of a bind; the next command warns; recover restores every time.
crash_loop bind "$(writes dry-run.out)" crash
cp /run/gpupass/journal.jsonl journal.jsonl 2>/dev/null && lab_file journal.jsonl journal.jsonl
# A crash then recover --continue completes the bind instead.
lab_cmd recover-continue.crash env GPUPASS_CRASH_AFTER_WRITE=3 gpupass bind 00:05.0
step recover-continue gpupass recover --continue
step continue-unbind gpupass unbind --all

# 7a. The same for unbind (docs/bind.md: rollback and recovery hold for both directions). From
# the group on vfio-pci (bound by gpupass): a failing write at every position of the unbind
# rolls it back to vfio-pci; a crash after every write is warned about and `recover` puts the
# group back on vfio-pci; a crash then `recover --continue` finishes the unbind. The unbind
# moves the VGA first (writes 1-3), then the HDA (4-6): only a crash after write 6 and the
# final --continue probe snd_hda_intel (2 of its 32 probes per boot, see docs/bind.md).
step unbind-loops-bind gpupass bind 00:05.0
step unbind-dry-run gpupass unbind --dry-run --json 00:05.0
fail_loop unbind "$(writes unbind-dry-run.out)" unbind-rollback
crash_loop unbind "$(writes unbind-dry-run.out)" unbind-crash
cp /run/gpupass/journal.jsonl unbind-journal.jsonl 2>/dev/null && lab_file unbind-journal.jsonl unbind-journal.jsonl
lab_cmd unbind-recover-continue.crash env GPUPASS_CRASH_AFTER_WRITE=3 gpupass unbind 00:05.0
step unbind-recover-continue gpupass recover --continue

# 7b. In use, on the real kernel: a process holding 00:05.0's DRM node open refuses the bind
# (naming the pid), a process holding /dev/vfio/N open refuses the unbind; both change nothing,
# and both go through once the holder is gone.
# held STEP NODE MODE CMD...: CMD as STEP while a process holds NODE open (MODE < or <>); the
# holder's pid is a fact of the step.
held() {
  hstep=$1 hnode=$2 hmode=$3; shift 3
  sh -c "exec 7$hmode $hnode; exec sleep 60" &
  hpid=$!
  sleep 0.3
  lab_cmd "$hstep" "$@"
  state "$hstep" "holder.pid=$hpid" "holder.node=$hnode"
  kill $hpid; wait $hpid 2> /dev/null
}
card=$(ls /sys/bus/pci/devices/$VGA/drm 2>/dev/null | grep '^card' | head -1)
if [ -n "$card" ] && [ -c /dev/dri/$card ]; then
  held drm-open-refused /dev/dri/$card "<" gpupass bind 00:05.0
else
  state drm-open-refused "holder.node=(no DRM card node for $VGA)"
fi
step inuse-bind gpupass bind 00:05.0
held vfio-open-refused /dev/vfio/$G "<>" gpupass unbind 00:05.0
step inuse-unbind gpupass unbind 00:05.0

# 7b'. Addresses that cannot be bound: one that does not exist, and a bridge (the root port
# 00:08.0): exit 1 with the reason, nothing changed.
step no-such-address gpupass bind 00:1f.7
lab_cmd bridge-refused gpupass bind 00:08.0
state bridge-refused "bridge.driver=$(lab_driver $BRIDGE)"

# 7c. vfio-pci not loaded: bind loads it (the plan's first step) and goes on.
lab_cmd rmmod rmmod vfio_pci
lab_cmd vfio-pci-loaded gpupass bind --json 00:05.0
state vfio-pci-loaded "vfio_pci.module=$([ -d /sys/module/vfio_pci ] && echo loaded || echo absent)"
# unbind --group G, the group by number.
step unbind-group gpupass unbind --json --group $G

# 7d. A group bound by someone else (plain sysfs writes, no journal entry): unbind reprobes each
# function and says which driver claimed it.
for f in $HDA $VGA; do
  echo vfio-pci > /sys/bus/pci/devices/$f/driver_override
  echo $f > /sys/bus/pci/devices/$f/driver/unbind
  echo $f > /sys/bus/pci/drivers_probe
done
state foreign-bound
step foreign-unbind gpupass unbind 00:05.0

# 8. persist: driverctl files (read back by Debian's driverctl in bind.check on the host).
lab_cmd persist gpupass persist 00:05.0
state persist "driverctl.vga=$(file_fact /etc/driverctl.d/pci-$VGA)" "driverctl.hda=$(file_fact /etc/driverctl.d/pci-$HDA)"
# list/show name the persisted driver.
lab_cmd persist-show gpupass show 00:05.0
rm -rf /tmp/snap
gpupass snapshot /tmp/snap > /dev/null && mkdir -p /tmp/snap/etc && cp -r /etc/driverctl.d /tmp/snap/etc/
tar -C /tmp/snap -czf persist-tree.tar.gz . && lab_file persist-tree.tar.gz persist-tree.tar.gz
lab_cmd persist-remove gpupass persist --remove 00:05.0
state persist-remove "driverctl.vga=$(file_fact /etc/driverctl.d/pci-$VGA)" "driverctl.hda=$(file_fact /etc/driverctl.d/pci-$HDA)"
state end
