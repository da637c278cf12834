#!/usr/bin/env bash
# Download Debian packages from a suite the system's apt sources do not name
# (bookworm-backports), into a private apt state under the lab cache.  The
# system's apt configuration is never edited: a temporary sources list and
# private lists/cache directories are passed with -o.
#
#   aptfetch.sh STATE_DIR SUITE ACTION ARGS...
#     ACTION=version PKG          highest version of PKG in SUITE (or in suites
#                                 matching $APTFETCH_MATCH, e.g. "bookworm")
#     ACTION=download DEST PKG... download PKG (PKG=VER allowed) into DEST
#     ACTION=closure DEST PKG...  download PKG and every dependency the
#                                 system lacks (no install), into DEST
set -euo pipefail
state=$1 suite=$2 action=$3; shift 3
mkdir -p "$state/lists/partial" "$state/cache/archives/partial"
# One apt at a time on this private state (the lab's legs prepare side by side).
exec 8>"$state/.lock"
flock 8
src=$state/sources.list
case $suite in
  *-security) uri=http://deb.debian.org/debian-security ;;
  *) uri=http://deb.debian.org/debian ;;
esac
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite main" >"$src"
# Include the system's own suites too, so that dependency resolution sees
# what the base distribution provides.
[[ -f /etc/apt/sources.list.d/debian.sources ]] && cp /etc/apt/sources.list.d/debian.sources "$state/"
APT=(-o Dir::Etc::sourcelist="$src" -o Dir::Etc::sourceparts="$state/parts"
  -o Dir::State::Lists="$state/lists" -o Dir::Cache="$state/cache"
  -o Dir::State::status=/var/lib/dpkg/status
  -o APT::Sandbox::User=root -o Acquire::Retries=3)
mkdir -p "$state/parts"
cp -f /etc/apt/sources.list.d/*.sources "$state/parts/" 2>/dev/null || true
[[ -f /etc/apt/sources.list ]] && cat /etc/apt/sources.list >>"$src" 2>/dev/null || true
stamp=$state/lists/.updated-$suite
if [[ ! -f $stamp || -n $(find "$stamp" -mmin +720 2>/dev/null) ]]; then
  apt-get "${APT[@]}" update -qq >&2
  touch "$stamp"
fi
case $action in
  version)
    # Highest version of PKG offered by a suite whose name contains SUITE.
    apt-cache "${APT[@]}" madison "$1" |
      awk -F'|' -v s="${APTFETCH_MATCH:-$suite}" '$3 ~ (" " s) {gsub(/ /, "", $2); print $2; exit}'
    ;;
  download)
    dest=$1; shift
    mkdir -p "$dest"
    (cd "$dest" && apt-get "${APT[@]}" download -qq "$@" >&2)
    ;;
  closure)
    dest=$1; shift
    mkdir -p "$dest"
    # What apt would install (simulated against this system's dpkg status),
    # taking the named packages from SUITE.
    mapfile -t pk < <(apt-get "${APT[@]}" -o APT::Default-Release="$suite" install -s \
      --no-install-recommends "$@" 2>/dev/null | awk '$1 == "Inst" {v=$3; gsub(/[()]/, "", v); print $2 "=" v}')
    ((${#pk[@]})) || { echo "aptfetch: nothing to fetch for $*" >&2; exit 0; }
    (cd "$dest" && apt-get "${APT[@]}" download -qq "${pk[@]}" >&2)
    printf '%s\n' "${pk[@]}"
    ;;
  *) echo "aptfetch: unknown action $action" >&2; exit 2 ;;
esac
