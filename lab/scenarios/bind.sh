# lab-about: gpupass bind/unbind/recover/persist on the real kernel: VGA+HDA group 00:05.x, --only, boot VGA refusal, rollback at every write and crash after every write + recover, for bind and for unbind
# lab-needs: gpupass
# lab-timeout: 300
# lab-steps: start-drivers same-group dry-run dry-run-changes-nothing bind bind-drivers
# lab-steps: bind-node bind-viable bind-again bind-noop unbind unbind-drivers unbind-overrides
# lab-steps: unbind-node only-warning only-drivers only-not-viable only-unbind
# lab-steps: only-unbind-drivers bootvga-refused bootvga-untouched bootvga-force-dry-run
# lab-steps: bootvga-still-untouched bind-writes rollback-1 rollback-2 rollback-3 rollback-4
# lab-steps: rollback-5 rollback-6 crash-1 crash-2 crash-3 crash-4 crash-5 crash-6
# lab-steps: recover-continue continue-drivers continue-unbind continue-unbind-drivers
# lab-steps: unbind-loops-bind unbind-dry-run unbind-writes unbind-rollback-1 unbind-rollback-2
# lab-steps: unbind-rollback-3 unbind-rollback-4 unbind-rollback-5 unbind-rollback-6
# lab-steps: unbind-crash-1 unbind-crash-2 unbind-crash-3 unbind-crash-4 unbind-crash-5
# lab-steps: unbind-crash-6 unbind-recover-continue unbind-continue-drivers
# lab-steps: unbind-continue-overrides drm-open-refused inuse-bind vfio-open-refused
# lab-steps: inuse-unbind inuse-end-drivers no-such-address bridge-refused vfio-pci-loaded
# lab-steps: unbind-group unbind-group-drivers foreign-bound foreign-unbind
# lab-steps: foreign-unbind-reports foreign-unbind-drivers persist persist-file persist-file-hda
# lab-steps: persist-lines persist-shown persist-remove persist-removed end-drivers
# lab-steps: host/driverctl
# Real driver moves on the guest kernel (never on the host). 00:05.0 (VGA, bochs-drm) and
# 00:05.1 (ICH9 HDA, snd_hda_intel) share one IOMMU group, like a GPU and its HDMI audio.
VGA=0000:00:05.0
HDA=0000:00:05.1
BOOT=0000:00:02.0
G=$(lab_group $VGA)

drivers() { echo "$(lab_driver $VGA) $(lab_driver $HDA)"; }
overrides() { echo "$(cat /sys/bus/pci/devices/$VGA/driver_override) $(cat /sys/bus/pci/devices/$HDA/driver_override)"; }
viable() { # GROUP -> true|false from gpupass groups --json
  gpupass groups --json 2>/dev/null | tr -d ' \n' | sed 's/},{/}\n{/g' | grep "\"number\":$1," | grep -o '"viable":[a-z]*' | cut -d: -f2
}

lab_expect start-drivers "bochs-drm snd_hda_intel" "$(drivers)"
lab_expect same-group "$G" "$(lab_group $HDA)"

# 1. The plan, as --dry-run prints it; nothing changes.
lab_run dry-run plan.txt gpupass bind --dry-run 00:05.0
lab_expect dry-run-changes-nothing "bochs-drm snd_hda_intel" "$(drivers)"

# 2. Naming one function binds the group; both on vfio-pci, /dev/vfio/G, viable.
lab_run bind bind.txt gpupass bind 00:05.0
lab_expect bind-drivers "vfio-pci vfio-pci" "$(drivers)"
if [ -c /dev/vfio/$G ]; then lab_pass bind-node "/dev/vfio/$G is a character device"; else lab_fail bind-node "no /dev/vfio/$G"; fi
lab_expect bind-viable true "$(viable $G)"
lab_run bind-again bind-again.txt gpupass bind 00:05.1
if grep -q "already on vfio-pci, nothing to do" bind-again.txt; then lab_pass bind-noop "second bind is a no-op"; else lab_fail bind-noop "$(head -1 bind-again.txt)"; fi

# 3. Unbind restores the drivers gpupass recorded; the group node goes away.
lab_run unbind unbind.txt gpupass unbind 00:05.0
lab_expect unbind-drivers "bochs-drm snd_hda_intel" "$(drivers)"
lab_expect unbind-overrides "(null) (null)" "$(overrides)"
if [ -e /dev/vfio/$G ]; then lab_fail unbind-node "/dev/vfio/$G still there"; else lab_pass unbind-node "/dev/vfio/$G gone"; fi

# 4. --only: said up front that the group will not be viable, and which member blocks it.
gpupass bind --only 00:05.0 > only.txt 2> only.err
rc=$?
cat only.txt only.err
lab_file only.err only.err
if [ $rc = 0 ] && grep -q "will not be viable" only.err && grep -q "$HDA (snd_hda_intel" only.err; then
  lab_pass only-warning "$(grep -o 'group [0-9]* will not be viable[^;]*' only.err | head -1)"
else
  lab_fail only-warning "rc=$rc $(tail -1 only.err)"
fi
lab_expect only-drivers "vfio-pci snd_hda_intel" "$(drivers)"
lab_expect only-not-viable false "$(viable $G)"
lab_run only-unbind only-unbind.txt gpupass unbind 00:05.0
lab_expect only-unbind-drivers "bochs-drm snd_hda_intel" "$(drivers)"

# 5. The boot VGA with the framebuffer console is refused without --force.
ls -l /sys/class/graphics/ /sys/class/vtconsole/ > consoles.txt 2>&1
for v in /sys/class/vtconsole/*; do echo "$v $(cat $v/name) bind=$(cat $v/bind)"; done >> consoles.txt
for f in /sys/class/graphics/fb*; do echo "$f -> $(readlink -f $f/device)"; done >> consoles.txt
lab_file consoles.txt consoles.txt
gpupass bind 00:02.0 > bootvga.txt 2> bootvga.err
rc=$?
cat bootvga.err
lab_file bootvga.err bootvga.err
if [ $rc = 1 ] && grep -q "boot VGA" bootvga.err && grep -q -- "--force" bootvga.err; then
  lab_pass bootvga-refused "$(grep -o 'is the boot VGA[^;]*' bootvga.err | head -1)"
else
  lab_fail bootvga-refused "rc=$rc $(tail -1 bootvga.err)"
fi
lab_expect bootvga-untouched bochs-drm "$(lab_driver $BOOT)"
lab_run bootvga-force-dry-run bootvga-force.txt gpupass bind --force --dry-run 00:02.0
lab_expect bootvga-still-untouched bochs-drm "$(lab_driver $BOOT)"

# writes PLANFILE: how many sysfs writes a --dry-run plan makes (its "N. write ..." steps); the
# failpoint loops below run once per write, so they cover every write the plan has.
writes() { grep -c '^ *[0-9]*\. write ' "$1"; }
W=$(writes plan.txt)
lab_expect bind-writes 6 "$W"

# fail_loop VERB COUNT PREFIX WANT: a failing write at every position of `gpupass VERB 00:05.0`
# rolls back to WANT ("drivers / overrides" of 00:05.0 and 00:05.1).
fail_loop() {
  n=1
  while [ $n -le "$2" ]; do
    GPUPASS_FAIL_WRITE=$n gpupass "$1" 00:05.0 > fail.txt 2> fail.err
    rc=$?
    got="$(drivers) / $(overrides)"
    if [ $rc = 1 ] && grep -q "rolled back" fail.err && [ "$got" = "$4" ]; then
      lab_pass "$3-$n" "write $n failed, rolled back: $got"
    else
      lab_fail "$3-$n" "rc=$rc state='$got' :: $(tail -1 fail.err)"
    fi
    n=$((n + 1))
  done
}
# crash_loop VERB COUNT PREFIX WANT: a crash after every write of `gpupass VERB 00:05.0` is
# warned about by the next command, and `recover` restores WANT.
crash_loop() {
  n=1
  while [ $n -le "$2" ]; do
    GPUPASS_CRASH_AFTER_WRITE=$n gpupass "$1" 00:05.0 > crash.txt 2> crash.err
    rc=$?
    mid="$(drivers) / $(overrides)"
    gpupass list > /dev/null 2> warn.err
    if grep -q "unfinished gpupass $1" warn.err; then w=warned; else w=silent; fi
    gpupass recover > recover.txt 2> recover.err
    rrc=$?
    got="$(drivers) / $(overrides)"
    if [ $rc -ge 128 ] && [ $w = warned ] && [ $rrc = 0 ] && [ "$got" = "$4" ]; then
      lab_pass "$3-$n" "rc=$rc mid-state '$mid', list $w, recover -> $got"
    else
      lab_fail "$3-$n" "rc=$rc mid='$mid' list=$w recover-rc=$rrc state='$got' :: $(tail -1 recover.err)"
    fi
    n=$((n + 1))
  done
}
UNBOUND="bochs-drm snd_hda_intel / (null) (null)"
BOUND="vfio-pci vfio-pci / vfio-pci vfio-pci"

# 6. Rollback: a failing write at every position leaves everything as it was.
fail_loop bind "$W" rollback "$UNBOUND"

# 7. Crash after each write of a bind; the next command warns; recover restores every time.
crash_loop bind "$W" crash "$UNBOUND"
cp /run/gpupass/journal.jsonl journal.jsonl 2>/dev/null && lab_file journal.jsonl journal.jsonl
# A crash then recover --continue completes the bind instead.
GPUPASS_CRASH_AFTER_WRITE=3 gpupass bind 00:05.0 > /dev/null 2>&1
lab_run recover-continue recover-continue.txt gpupass recover --continue
lab_expect continue-drivers "vfio-pci vfio-pci" "$(drivers)"
lab_run continue-unbind continue-unbind.txt gpupass unbind --all
lab_expect continue-unbind-drivers "bochs-drm snd_hda_intel" "$(drivers)"

# 7a. The same for unbind (docs/bind.md: rollback and recovery hold for both directions). From
# the group on vfio-pci (bound by gpupass): a failing write at every position of the unbind
# rolls it back to vfio-pci; a crash after every write is warned about and `recover` puts the
# group back on vfio-pci; a crash then `recover --continue` finishes the unbind. The unbind
# moves the VGA first (writes 1-3), then the HDA (4-6): only a crash after write 6 and the
# final --continue probe snd_hda_intel (2 of its 32 probes per boot, see docs/bind.md).
lab_check unbind-loops-bind gpupass bind 00:05.0
lab_run unbind-dry-run unbind-plan.txt gpupass unbind --dry-run 00:05.0
U=$(writes unbind-plan.txt)
lab_expect unbind-writes 6 "$U"
fail_loop unbind "$U" unbind-rollback "$BOUND"
crash_loop unbind "$U" unbind-crash "$BOUND"
cp /run/gpupass/journal.jsonl unbind-journal.jsonl 2>/dev/null && lab_file unbind-journal.jsonl unbind-journal.jsonl
GPUPASS_CRASH_AFTER_WRITE=3 gpupass unbind 00:05.0 > /dev/null 2>&1
lab_run unbind-recover-continue unbind-recover-continue.txt gpupass recover --continue
lab_expect unbind-continue-drivers "bochs-drm snd_hda_intel" "$(drivers)"
lab_expect unbind-continue-overrides "(null) (null)" "$(overrides)"

# 7b. In use, on the real kernel: a process holding 00:05.0's DRM node open refuses the bind
# (naming the pid), a process holding /dev/vfio/N open refuses the unbind; both change nothing,
# and both go through once the holder is gone.
# held STEP NODE MODE WANT-DRIVERS CMD...: while a process holds NODE open (MODE < or <>), CMD
# must fail with exit 1 naming that pid and leave the drivers at WANT-DRIVERS.
held() {
  hstep=$1 hnode=$2 hmode=$3 hwant=$4; shift 4
  sh -c "exec 7$hmode $hnode; exec sleep 60" &
  hpid=$!
  sleep 0.3
  "$@" > "$hstep.out" 2> "$hstep.err"; hrc=$?
  if [ $hrc = 1 ] && grep -q "pid $hpid" "$hstep.err" && [ "$(drivers)" = "$hwant" ]; then
    lab_pass "$hstep" "rc=1, names pid $hpid, nothing changed"
  else
    lab_fail "$hstep" "rc=$hrc drivers=$(drivers) :: $(tr '\n' '|' < "$hstep.err")"
  fi
  kill $hpid; wait $hpid 2> /dev/null
  lab_file "$hstep.err" "$hstep.err"
}
card=$(ls /sys/bus/pci/devices/$VGA/drm 2>/dev/null | grep '^card' | head -1)
if [ -n "$card" ] && [ -c /dev/dri/$card ]; then
  held drm-open-refused /dev/dri/$card "<" "bochs-drm snd_hda_intel" gpupass bind 00:05.0
else
  lab_fail drm-open-refused "no DRM card node for $VGA"
fi
lab_check inuse-bind gpupass bind 00:05.0
g=$(basename "$(readlink /sys/bus/pci/devices/$VGA/iommu_group)")
held vfio-open-refused /dev/vfio/$g "<>" "vfio-pci vfio-pci" gpupass unbind 00:05.0
lab_check inuse-unbind gpupass unbind 00:05.0
lab_expect inuse-end-drivers "bochs-drm snd_hda_intel" "$(drivers)"

# 7b'. Addresses that cannot be bound: one that does not exist, and a bridge (the root port
# 00:08.0): exit 1 with the reason, nothing changed.
gpupass bind 00:1f.7 > noaddr.txt 2> noaddr.err; rc=$?
if [ $rc = 1 ] && grep -q "no such PCI device" noaddr.err; then lab_pass no-such-address "$(grep -o 'no such PCI device[^;]*' noaddr.err | head -1)"; else lab_fail no-such-address "rc=$rc $(tr '\n' '|' < noaddr.err)"; fi
gpupass bind 00:08.0 > bridge.txt 2> bridge.err; rc=$?
if [ $rc = 1 ] && grep -q "bridge" bridge.err && [ "$(lab_driver 0000:00:08.0)" = pcieport ]; then
  lab_pass bridge-refused "$(grep -o 'is a PCI bridge[^;]*' bridge.err | head -1)"
else
  lab_fail bridge-refused "rc=$rc driver=$(lab_driver 0000:00:08.0) $(tr '\n' '|' < bridge.err)"
fi

# 7c. vfio-pci not loaded: bind loads it (the plan's first step) and goes on.
if rmmod vfio_pci 2> rmmod.err; then
  gpupass bind 00:05.0 > modload.txt 2>&1; rc=$?
  if [ $rc = 0 ] && [ -d /sys/module/vfio_pci ] && [ "$(drivers)" = "vfio-pci vfio-pci" ]; then
    lab_pass vfio-pci-loaded "bind loaded vfio_pci and bound the group"
  else
    lab_fail vfio-pci-loaded "rc=$rc module=$([ -d /sys/module/vfio_pci ] && echo loaded || echo absent) drivers=$(drivers) :: $(tr '\n' '|' < modload.txt)"
  fi
  # unbind --group G, the group by number.
  lab_run unbind-group unbind-group.txt gpupass unbind --group $G
  lab_expect unbind-group-drivers "bochs-drm snd_hda_intel" "$(drivers)"
else
  lab_fail vfio-pci-loaded "cannot unload vfio_pci to test it: $(cat rmmod.err)"
fi

# 7d. A group bound by someone else (plain sysfs writes, no journal entry): unbind reprobes each
# function and says which driver claimed it.
for f in $HDA $VGA; do
  echo vfio-pci > /sys/bus/pci/devices/$f/driver_override
  echo $f > /sys/bus/pci/devices/$f/driver/unbind
  echo $f > /sys/bus/pci/drivers_probe
done
lab_expect foreign-bound "vfio-pci vfio-pci" "$(drivers)"
lab_run foreign-unbind foreign-unbind.txt gpupass unbind 00:05.0
if grep -q "no journal entry" foreign-unbind.txt && grep -q "$VGA: reprobed, claimed by bochs-drm" foreign-unbind.txt &&
  grep -q "$HDA: reprobed, claimed by snd_hda_intel" foreign-unbind.txt; then
  lab_pass foreign-unbind-reports "$(grep -c 'reprobed, claimed by' foreign-unbind.txt) functions reprobed, each driver named"
else
  lab_fail foreign-unbind-reports "$(tr '\n' '|' < foreign-unbind.txt)"
fi
lab_expect foreign-unbind-drivers "bochs-drm snd_hda_intel" "$(drivers)"

# 8. persist: driverctl files (read back by Debian's driverctl in bind.check on the host).
lab_run persist persist.txt gpupass persist 00:05.0
lab_expect persist-file vfio-pci "$(cat /etc/driverctl.d/pci-$VGA 2>/dev/null)"
lab_expect persist-file-hda vfio-pci "$(cat /etc/driverctl.d/pci-$HDA 2>/dev/null)"
if grep -q "softdep bochs pre: vfio-pci" persist.txt && grep -q "vfio-pci.ids=1234:1111,8086:293e" persist.txt; then
  lab_pass persist-lines "$(grep -o 'vfio-pci.ids=[^ ]*' persist.txt)"
else
  lab_fail persist-lines "$(tr '\n' '|' < persist.txt)"
fi
# list/show name the persisted driver.
gpupass show 00:05.0 > persist-show.txt 2>&1
if grep -q "Persistent driver.*vfio-pci (driverctl)" persist-show.txt; then
  lab_pass persist-shown "$(grep 'Persistent driver' persist-show.txt | tr -s ' ')"
else
  lab_fail persist-shown "$(tr '\n' '|' < persist-show.txt)"
fi
rm -rf /tmp/snap
gpupass snapshot /tmp/snap > /dev/null && mkdir -p /tmp/snap/etc && cp -r /etc/driverctl.d /tmp/snap/etc/
tar -C /tmp/snap -czf persist-tree.tar.gz . && lab_file persist-tree.tar.gz persist-tree.tar.gz
lab_run persist-remove persist-remove.txt gpupass persist --remove 00:05.0
if [ -e /etc/driverctl.d/pci-$VGA ] || [ -e /etc/driverctl.d/pci-$HDA ]; then lab_fail persist-removed "files remain"; else lab_pass persist-removed "no driverctl files"; fi
lab_expect end-drivers "bochs-drm snd_hda_intel" "$(drivers)"
