#!/usr/bin/env bash
# Download Debian packages from a suite the system's apt sources may not name
# (bookworm-backports), into a private apt state under the lab cache.  The
# system's apt configuration is never edited, and never read either: the
# private sources list names this release's own suites (bookworm,
# bookworm-updates, bookworm-security) plus SUITE, so what the system's lists
# happen to hold (a trixie line, a backports line, nothing) changes nothing.
# Dependency resolution runs against the system's dpkg status, so a closure
# holds what this system lacks (or has too old).
#
#   aptfetch.sh STATE_DIR SUITE ACTION ARGS...
#     ACTION=version PKG          highest version of PKG in SUITE (or in suites
#                                 matching $APTFETCH_MATCH, e.g. "bookworm")
#     ACTION=download DEST PKG... download PKG (PKG=VER allowed) into DEST
#     ACTION=plan PKG...          print PKG=VER, one a line, for each named
#                                 package (always, even if installed) and each
#                                 dependency apt would install or upgrade
#     ACTION=closure DEST PKG... [-- EXTRA...]
#                                 download what `plan` prints into DEST and
#                                 print it; EXTRA (PKG=VER) are downloaded too,
#                                 without their dependencies (nothing resolves
#                                 them: files of the same build, e.g. modules)
#   aptfetch.sh - - parse-inst    read `apt-get install -s` output on stdin,
#                                 print PKG=VER for each Inst line (no apt)
#
# APTFETCH_STATUS=FILE resolves against FILE instead of /var/lib/dpkg/status
# (tests: a system without QEMU, with Debian's 7.2, with backports' 10.0).
# APTFETCH_MIRROR=URI replaces http://deb.debian.org (the security suite too,
# as URI-security).
set -euo pipefail

# `apt-get install -s` prints one line per package it would unpack:
#   Inst PKG (NEW_VERSION SUITES [ARCH])            a new package
#   Inst PKG [INSTALLED_VERSION] (NEW_VERSION ...)  an upgrade (or downgrade)
# The version to fetch is the first word inside the parentheses, never the
# bracketed one: that is the version installed now, which no suite may carry.
parse_inst() {
  awk '$1 == "Inst" {
    v = ""
    for (i = 3; i <= NF; i++) if (substr($i, 1, 1) == "(") { v = substr($i, 2); break }
    gsub(/\)$/, "", v)
    if (v == "") { print "aptfetch: cannot read the version in: " $0 > "/dev/stderr"; bad = 1; next }
    print $2 "=" v
  } END { exit bad }'
}

if [[ ${3:-} == parse-inst ]]; then parse_inst; exit; fi

state=$1 suite=$2 action=$3; shift 3
mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/parts"
# One apt at a time on this private state (the lab's legs prepare side by side).
exec 8>"$state/.lock"
flock 8
codename=bookworm
if [[ -r /etc/os-release ]]; then
  # shellcheck disable=SC1091
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
fi
mirror=${APTFETCH_MIRROR:-http://deb.debian.org}
src=$state/sources.list
{
  key="[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"
  echo "deb $key $mirror/debian $codename main"
  echo "deb $key $mirror/debian $codename-updates main"
  echo "deb $key $mirror/debian-security $codename-security main"
  case $suite in
    "$codename" | "$codename-updates" | "$codename-security") ;;
    *-security) echo "deb $key $mirror/debian-security $suite main" ;;
    *) echo "deb $key $mirror/debian $suite main" ;;
  esac
} >"$src.new"
# A changed list (another suite, another mirror) is fetched anew.
if ! cmp -s "$src.new" "$src"; then
  mv "$src.new" "$src"
  rm -f "$state"/lists/.updated-*
else
  rm -f "$src.new"
fi
# Nothing of the system's sources.list.d: the private parts directory is empty.
rm -f "$state"/parts/*
status=${APTFETCH_STATUS:-/var/lib/dpkg/status}
APT=(-o Dir::Etc::sourcelist="$src" -o Dir::Etc::sourceparts="$state/parts"
  -o Dir::State::Lists="$state/lists" -o Dir::Cache="$state/cache"
  -o Dir::State::status="$status"
  -o APT::Sandbox::User=root -o Acquire::Retries=3)
# What the sources offer, whatever this system has installed: a package installed at a version
# no source carries (backports' 10.0 under the plain bookworm suite) is apt's candidate when the
# real status is read, and then cannot be downloaded ("Can't find a source to download version
# '1:10.0.2+ds-2+deb13u1~bpo12+1'"). Candidates and downloads are resolved against an empty
# status; only the simulation (what an install would change here) reads the real one.
: >"$state/empty-status"
APT_SRC=("${APT[@]}" -o Dir::State::status="$state/empty-status")
stamp=$state/lists/.updated-$suite
if [[ ! -f $stamp || -n $(find "$stamp" -mmin +720 2>/dev/null) ]]; then
  apt-get "${APT[@]}" update -qq >&2 || {
    echo "aptfetch: apt-get update of $codename and $suite from $mirror failed (above)" >&2
    exit 1
  }
  touch "$stamp"
fi

# PKG=VER lines for the named packages and what apt would add for them.
plan() {
  local sim rc
  set +e
  sim=$(apt-get "${APT[@]}" -o APT::Default-Release="$suite" install -s \
    --no-install-recommends "$@" 2>&1)
  rc=$?
  set -e
  if ((rc != 0)); then
    printf '%s\n' "$sim" | grep -E '^(E|W):|Depends:|but' >&2 || printf '%s\n' "$sim" >&2
    echo "aptfetch: apt cannot resolve $* from $suite against this system (above)" >&2
    return 1
  fi
  local -A ver=()
  local order=() line p v
  while IFS= read -r line; do
    p=${line%%=*} v=${line#*=}
    [[ -n ${ver[$p]:-} ]] || order+=("$p")
    ver[$p]=$v
  done < <(printf '%s\n' "$sim" | parse_inst)
  # A named package is fetched even when installed (then apt plans nothing
  # for it): the lab's tree must hold every file of its build.
  for line in "$@"; do
    p=${line%%=*}
    if [[ $line == *=* ]]; then
      v=${line#*=}
    elif [[ -n ${ver[$p]:-} ]]; then
      continue
    else
      v=$(apt-cache "${APT_SRC[@]}" -o APT::Default-Release="$suite" policy "$p" |
        awk '$1 == "Candidate:" {print $2; exit}')
      [[ -n $v && $v != "(none)" ]] || {
        echo "aptfetch: no candidate for $p in $codename or $suite" >&2
        return 1
      }
    fi
    [[ -n ${ver[$p]:-} ]] || order+=("$p")
    ver[$p]=$v
  done
  for p in "${order[@]}"; do echo "$p=${ver[$p]}"; done
}

# Download PKG=VER... into the current directory; name each one that fails.
fetch() {
  apt-get "${APT_SRC[@]}" -o APT::Default-Release="$suite" download -qq "$@" >&2 && return 0
  local failed=() p
  for p in "$@"; do
    compgen -G "${p%%=*}_*.deb" >/dev/null ||
      apt-get "${APT_SRC[@]}" -o APT::Default-Release="$suite" download -qq "$p" >&2 || failed+=("$p")
  done
  ((${#failed[@]} == 0)) && return 0
  echo "aptfetch: could not download ${failed[*]} from $mirror ($codename, $suite): apt's message is above" >&2
  return 1
}

case $action in
  version)
    # Highest version of PKG offered by a suite whose name contains SUITE.
    apt-cache "${APT[@]}" madison "$1" |
      awk -F'|' -v s="${APTFETCH_MATCH:-$suite}" '$3 ~ (" " s) {gsub(/ /, "", $2); print $2; exit}'
    ;;
  download)
    dest=$1; shift
    mkdir -p "$dest"
    (cd "$dest" && fetch "$@")
    ;;
  plan)
    plan "$@"
    ;;
  closure)
    dest=$1; shift
    mkdir -p "$dest"
    named=() extra=()
    while (($#)); do
      if [[ $1 == -- ]]; then shift; extra=("$@"); break; fi
      named+=("$1"); shift
    done
    mapfile -t pk < <(plan "${named[@]}" || echo "!failed")
    [[ ${pk[${#pk[@]}-1]} != "!failed" ]] || exit 1
    pk+=("${extra[@]}")
    (cd "$dest" && fetch "${pk[@]}")
    printf '%s\n' "${pk[@]}"
    ;;
  *) echo "aptfetch: unknown action $action" >&2; exit 2 ;;
esac
