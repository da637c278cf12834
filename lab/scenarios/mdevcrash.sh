# lab-about: mdev crash points on the real kernel: a crash after every write of mdev create (--count 2), remove, start, stop, define and undefine (the write counts from --dry-run), the next command warns, recover restores the instance and definition set; recover --continue finishes a create and a remove
# lab-needs: gpupass
# lab-timeout: 300
# lab-steps: parents create-writes create-crash-*>=2 create-continue create-continue-clean
# lab-steps: remove-setup remove-writes remove-crash-*>=1 remove-continue
# lab-steps: define-writes define-crash-*>=1 undefine-setup undefine-writes undefine-crash-*>=1
# lab-steps: start-writes start-crash-*>=1 stop-setup stop-writes stop-crash-*>=1 end-clean
#
# The mdev side of bind.sh's crash loops, against the kernel's mdev sample parents (mtty,
# mbochs, mdpy; docs/lab.md). For each command: the write count is the one its `--dry-run`
# plan states (sysfs writes and definition-file writes/removals alike), then
# for n = 1..count: `GPUPASS_CRASH_AFTER_WRITE=n` aborts the command right after its n-th write
# (the test kit's failpoint, docs/testing.md), `gpupass list` must warn about the unfinished
# plan, `gpupass recover` must exit 0, and the set of active instances
# (/sys/bus/mdev/devices) and of definitions (etc/mdevctl.d, names and contents) must be what
# it was before the command.

MB=/sys/class/mdev_bus
UR=eeeeeeee-1111-4222-8333-444444444444   # the instance remove/stop crash on
UD=eeeeeeee-2222-4222-8333-444444444444   # the definition define/undefine/start crash on

# state: the active instances, then the definitions (path and a digest of every file).
state() {
  a=$(ls /sys/bus/mdev/devices 2>/dev/null | sort | tr '\n' ' ')
  d=$(find /etc/mdevctl.d -type f 2>/dev/null | grep -v '/scripts.d/' | sort)
  s=$(for f in $d; do echo "$f $(md5sum < "$f" | cut -c1-8)"; done | tr '\n' ' ')
  echo "active: ${a:-none} | defined: ${s:-none}"
}
# writes PLANFILE: the write count a --dry-run plan states in its header ("plan: ... (N
# writes)", the engine's count, the one the failpoint counts), when its numbered steps agree
# (each "N. write ..." and "N. remove file ..." step is one write); else "mismatch".
writes() {
  _h=$(sed -n 's/^plan: .*(\([0-9]*\) writes)$/\1/p' "$1" | head -1)
  _s=$(grep -c -e '^ *[0-9]*\. write ' -e '^ *[0-9]*\. remove file ' "$1")
  if [ -n "$_h" ] && [ "$_h" = "$_s" ]; then echo "$_h"; else echo "mismatch(header=$_h steps=$_s)"; fi
}

# crash_loop PREFIX COUNT WARN CMD...: a crash after each write of CMD; the next command warns
# (its message names WARN), `recover` restores the state seen before.
crash_loop() {
  prefix=$1 count=$2 warn=$3; shift 3
  want=$(state)
  n=1
  while [ "$n" -le "$count" ]; do
    GPUPASS_CRASH_AFTER_WRITE=$n "$@" > crash.txt 2> crash.err
    rc=$?
    mid=$(state)
    gpupass list > /dev/null 2> warn.err
    if grep -q "unfinished gpupass $warn" warn.err; then w=warned; else w=silent; fi
    gpupass recover > recover.txt 2> recover.err
    rrc=$?
    got=$(state)
    if [ $rc -ge 128 ] && [ $w = warned ] && [ $rrc = 0 ] && [ "$got" = "$want" ] && [ "$mid" != "$want" ]; then
      lab_pass "$prefix-$n" "rc=$rc mid '$mid', list $w, recover -> '$got'"
    else
      lab_fail "$prefix-$n" "rc=$rc mid='$mid' list=$w recover-rc=$rrc want='$want' got='$got' :: $(tr '\n' '|' < warn.err) $(tail -1 recover.err)"
    fi
    n=$((n + 1))
  done
}
# plan STEP FILE CMD...: CMD --dry-run into FILE; prints its write count.
plan() {
  pstep=$1 pfile=$2; shift 2
  "$@" --dry-run > "$pfile" 2>&1
  lab_file "$pfile" "$pfile"
  writes "$pfile"
}

mkdir -p /etc/mdevctl.d
if [ -d $MB/mtty ] && [ -d $MB/mbochs ]; then lab_pass parents "mtty and mbochs present"; else lab_fail parents "$(ls $MB 2>&1)"; fi
START=$(state)

# 1. create --count 2: one `create` write per instance.
W=$(plan create create-plan.txt gpupass mdev create --parent mtty --type mtty-1 --count 2)
lab_expect create-writes 2 "$W"
crash_loop create-crash "$W" "mdev create" gpupass mdev create --parent mtty --type mtty-1 --count 2
# A crash after the first write, then recover --continue: both instances exist.
GPUPASS_CRASH_AFTER_WRITE=1 gpupass mdev create --parent mtty --type mtty-1 --count 2 > /dev/null 2>&1
gpupass recover --continue > continue.txt 2>&1
made=$(ls /sys/bus/mdev/devices | wc -l)
if [ "$made" = 2 ]; then lab_pass create-continue "$(state)"; else lab_fail create-continue "$made instances: $(cat continue.txt)"; fi
for u in $(ls /sys/bus/mdev/devices); do gpupass mdev remove "$u" > /dev/null 2>&1; done
lab_expect create-continue-clean "$START" "$(state)"

# 2. remove: the instance comes back on recover.
lab_check remove-setup gpupass mdev create --parent mbochs --type mbochs-small --uuid $UR
W=$(plan remove remove-plan.txt gpupass mdev remove $UR)
lab_expect remove-writes 1 "$W"
crash_loop remove-crash "$W" "mdev remove" gpupass mdev remove $UR
GPUPASS_CRASH_AFTER_WRITE=1 gpupass mdev remove $UR > /dev/null 2>&1
gpupass recover --continue > continue-rm.txt 2>&1
lab_expect remove-continue "$START" "$(state)"

# 3. define and undefine: a definition file written, then removed.
W=$(plan define define-plan.txt gpupass mdev define --parent mdpy --type mdpy-vga --uuid $UD --auto)
lab_expect define-writes 1 "$W"
crash_loop define-crash "$W" "mdev define" gpupass mdev define --parent mdpy --type mdpy-vga --uuid $UD --auto
lab_check undefine-setup gpupass mdev define --parent mdpy --type mdpy-vga --uuid $UD --auto
W=$(plan undefine undefine-plan.txt gpupass mdev undefine $UD)
lab_expect undefine-writes 1 "$W"
crash_loop undefine-crash "$W" "mdev undefine" gpupass mdev undefine $UD

# 4. start and stop of that definition: the instance made, then removed.
W=$(plan start start-plan.txt gpupass mdev start $UD)
lab_expect start-writes 1 "$W"
crash_loop start-crash "$W" "mdev start" gpupass mdev start $UD
lab_check stop-setup gpupass mdev start $UD
W=$(plan stop stop-plan.txt gpupass mdev stop $UD)
lab_expect stop-writes 1 "$W"
crash_loop stop-crash "$W" "mdev stop" gpupass mdev stop $UD
gpupass mdev stop $UD > /dev/null 2>&1
gpupass mdev undefine $UD > /dev/null 2>&1
cp /run/gpupass/journal.jsonl journal.jsonl 2>/dev/null && lab_file journal.jsonl journal.jsonl
lab_expect end-clean "$START" "$(state)"
