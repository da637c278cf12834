# Helpers for lab scenarios (busybox sh), sourced before each scenario.
# Every structured line goes to the data channel $LAB_DATA (/dev/ttyS1);
# results are also echoed to the console for people watching.
LAB_DATA=/dev/ttyS1

lab_emit() { echo "$*" >> "$LAB_DATA"; }

# lab_result STEP PASS|FAIL DETAIL...
lab_result() {
  _step=$1 _st=$2; shift 2
  echo "LAB-RESULT $LAB_SCENARIO $_step $_st $*"
  lab_emit "LAB-RESULT $LAB_SCENARIO $_step $_st $*"
}
lab_pass() { _s=$1; shift; lab_result "$_s" PASS "$@"; }
lab_fail() { _s=$1; shift; lab_result "$_s" FAIL "$@"; }

# lab_check STEP CMD...: PASS if CMD exits 0, else FAIL with its last output line.
lab_check() {
  _s=$1; shift
  if _o=$("$@" 2>&1); then lab_pass "$_s" "$*"; else lab_fail "$_s" "rc=$? $* :: $(echo "$_o" | tail -1)"; fi
}

# lab_expect STEP WANT GOT: PASS if equal.
lab_expect() {
  if [ "$2" = "$3" ]; then lab_pass "$1" "$3"; else lab_fail "$1" "want '$2' got '$3'"; fi
}

# lab_file NAME PATH: ship a file to the host (target/lab/out/<scenario>/NAME).
lab_file() {
  _n=$1 _p=$2
  if [ ! -f "$_p" ]; then lab_fail "file-$_n" "no such file $_p"; return 1; fi
  _sz=$(wc -c < "$_p"); _md5=$(md5sum < "$_p" | cut -d' ' -f1)
  lab_emit "LAB-FILE-BEGIN $LAB_SCENARIO $_n"
  base64 "$_p" >> "$LAB_DATA"
  lab_emit "LAB-FILE-END $LAB_SCENARIO $_n $_sz $_md5"
}

# lab_run STEP NAME CMD...: run CMD, show its output on the console, save
# stdout as NAME, ship it (and NAME.stderr when not empty); PASS iff rc=0.
lab_run() {
  _s=$1 _n=$2; shift 2
  echo "\$ $*"
  "$@" > "$_n" 2> "$_n.stderr"
  _rc=$?
  cat "$_n" "$_n.stderr"
  lab_file "$_n" "$_n"
  [ -s "$_n.stderr" ] && lab_file "$_n.stderr" "$_n.stderr"
  if [ $_rc = 0 ]; then lab_pass "$_s" "$*"; else lab_fail "$_s" "rc=$_rc $* :: $(tail -1 "$_n.stderr")"; fi
  return $_rc
}

# Judged scenarios (`# lab-judge: rust`, docs/lab.md "Judged scenarios") report no results of
# their own: the guest runs the commands and ships what they did, and the Rust judge
# (tests/it/labjudge, run by lab.sh on the host) decides each step.

# lab_cmd NAME CMD...: run CMD (stdin /dev/null) and ship NAME.out (stdout), NAME.err (stderr)
# and NAME.rc (its exit status); print them on the console. Returns CMD's status.
lab_cmd() {
  _cn=$1; shift
  echo "\$ $*"
  "$@" > "$_cn.out" 2> "$_cn.err" < /dev/null
  _crc=$?
  echo "$_crc" > "$_cn.rc"
  cat "$_cn.out" "$_cn.err"
  lab_file "$_cn.out" "$_cn.out"
  lab_file "$_cn.err" "$_cn.err"
  lab_file "$_cn.rc" "$_cn.rc"
  return $_crc
}

# lab_facts NAME KEY=VALUE...: ship what the guest read itself (sysfs links, /dev nodes, files),
# not through gpupass, as NAME.facts: one KEY=VALUE a line.
lab_facts() {
  _fn=$1; shift
  : > "$_fn.facts"
  for _kv in "$@"; do echo "$_kv" >> "$_fn.facts"; done
  lab_file "$_fn.facts" "$_fn.facts"
}

# lab_group BDF: IOMMU group number of a PCI device (empty if none).
lab_group() { _l=$(readlink "/sys/bus/pci/devices/$1/iommu_group" 2>/dev/null) && basename "$_l"; }
# lab_driver BDF: bound driver name (empty if none).
lab_driver() { _l=$(readlink "/sys/bus/pci/devices/$1/driver" 2>/dev/null) && basename "$_l"; }

# lab_caps BDF: the PCI capability IDs of a function (0x..), walked from config space.
lab_caps() {
  _cfg=/sys/bus/pci/devices/$1/config
  _b() { od -An -tu1 -j "$1" -N1 "$_cfg" | tr -d ' '; }
  _p=$(_b 52) _out='' _n=0
  while [ "${_p:-0}" -ne 0 ] && [ $_n -lt 48 ]; do
    _out="$_out $(printf '0x%02x' "$(_b "$_p")")"
    _p=$(_b $((_p + 1))); _n=$((_n + 1))
  done
  echo $_out
}

# lab_now_us: T = now in microseconds, from busybox adjtimex (no subshell: the value is left in
# T; reading it costs one process). The benchmarks' clock.
lab_now_us() {
  adjtimex > /tmp/adj
  while read -r _k _v _r; do
    case $_k in time.tv_sec:) _s=$_v ;; time.tv_usec:) _u=$_v ;; esac
  done < /tmp/adj
  _u=${_u#"${_u%%[!0]*}"}
  T=$((_s * 1000000 + ${_u:-0}))
}
