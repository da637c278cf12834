# lab-about: 8 gpupass processes at once on the real kernel (bind/unbind 00:03.0, 00:05.0+00:05.1, 01:00.0; mdev create/remove on mbochs): every group whole afterwards, journal closed, no mdev leaked, no panic
# lab-needs: gpupass
# lab-timeout: 300
# lab-steps: exit-statuses did-bind did-unbind did-mdev-create did-mdev-remove group-00:05-whole
# lab-steps: journal-closed mdevs-after drivers-restored
# The real-kernel twin of tests/it/concurrency.rs. The global flock serializes the driver changes;
# mdev create/remove race in the kernel (available_instances), where a refusal is a legal answer.
A=0000:00:03.0
VGA=0000:00:05.0
HDA=0000:00:05.1
C=0000:01:00.0
ROUNDS=${ROUNDS:-5}

for d in $A $VGA $HDA $C; do echo "$d $(lab_driver $d) group $(lab_group $d)"; done > start.txt
lab_file start.txt start.txt
start="$(lab_driver $A) $(lab_driver $VGA) $(lab_driver $HDA) $(lab_driver $C)"
mdevs_before=$(ls /sys/bus/mdev/devices 2>/dev/null | wc -l)

# worker W: ROUNDS commands over the three groups, offset by W; writes W.log, one line per
# command: "<rc> <command>".
worker() {
  w=$1
  made=""
  r=0
  while [ $r -lt $ROUNDS ]; do
    k=$(( (w + r) % 3 ))
    case $k in 0) addr=$A ;; 1) addr=$VGA ;; *) addr=$C ;; esac
    case $(( (w + r) % 4 )) in
      0|2) cmd="bind $addr" ;;
      1) cmd="unbind $addr" ;;
      *) if [ -n "$made" ]; then cmd="mdev remove $made"; made=""; else cmd="mdev create -p mbochs -t mbochs-small"; fi ;;
    esac
    GPUPASS_LOCK_TIMEOUT=200 gpupass $cmd > out.$w.$r 2> err.$w.$r
    rc=$?
    echo "$rc $cmd" >> $w.log
    if [ "$rc" = 0 ] && [ "${cmd#mdev create}" != "$cmd" ]; then made=$(head -1 out.$w.$r); fi
    r=$((r + 1))
  done
  if [ -n "$made" ]; then
    gpupass mdev remove "$made" > /dev/null 2> err.$w.final
    echo "$? mdev remove $made (cleanup)" >> $w.log
  fi
}

t0=$(cut -d' ' -f1 /proc/uptime)
w=0
while [ $w -lt 8 ]; do rm -f $w.log; worker $w & w=$((w + 1)); done
wait
t1=$(cut -d' ' -f1 /proc/uptime)
cat [0-7].log > all.log
cat err.* > all.err 2>/dev/null
lab_file all.log all.log
lab_file all.err all.err

# No panic (101), no signal (>128), only 0 or 1.
bad=$(awk '$1 != 0 && $1 != 1' all.log | head -3 | tr '\n' '|')
if [ -z "$bad" ] && ! grep -q "panicked" all.err; then
  lab_pass exit-statuses "$(wc -l < all.log) commands in $t0..$t1 s: $(awk '$1==0' all.log | wc -l) ok, $(awk '$1==1' all.log | wc -l) refused"
else
  lab_fail exit-statuses "$bad $(grep -m1 panicked all.err)"
fi
for what in "bind" "unbind" "mdev create" "mdev remove"; do
  if awk -v w="$what" '$1 == 0 && index($0, "0 " w) == 1' all.log | grep -q .; then
    lab_pass "did-$(echo $what | tr ' ' '-')" "at least one succeeded"
  else
    lab_fail "did-$(echo $what | tr ' ' '-')" "none succeeded"
  fi
done

# Every group wholly on one side.
side() { case "$(lab_driver $1)" in vfio-pci) echo vfio ;; *) echo host ;; esac; }
lab_expect group-00:05-whole "$(side $VGA)" "$(side $HDA)"
for d in $A $VGA $HDA $C; do echo "$d $(lab_driver $d)"; done > end.txt
lab_file end.txt end.txt

# The journal is closed.
gpupass recover --dry-run > recover.txt 2>&1
if grep -q "nothing to recover" recover.txt; then lab_pass journal-closed "no unfinished transaction"; else lab_fail journal-closed "$(head -1 recover.txt)"; fi

# No mdev leaked.
lab_expect mdevs-after "$mdevs_before" "$(ls /sys/bus/mdev/devices 2>/dev/null | wc -l)"

# Give everything back and check the drivers are the ones before.
for d in $A $VGA $C; do gpupass unbind $d > /dev/null 2>&1; done
lab_expect drivers-restored "$start" "$(lab_driver $A) $(lab_driver $VGA) $(lab_driver $HDA) $(lab_driver $C)"
