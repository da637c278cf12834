#!/usr/bin/env bash
# The go command of every Go build in this project (lab/cluster/build.sh; tests/cdi-validate and
# tests/dra-validate, built by tests/it): Go 1.26 or newer, which their go.mod files need
# (Debian 12's golang-go 1.19 cannot build them). Prints its path; tests/install-deps.sh runs it
# first, so the README's test command gets Go by itself.
#
#   lab/tools/go.sh    print the path of a go >= 1.26 (fetching go1.26.8 when none is found)
#
# Where it looks, the first that says it is 1.26 or newer wins:
#   1. $GO, when set: the only candidate (an explicit choice is never replaced; too old: exit 1);
#   2. `go` on PATH;
#   3. ${GPUPASS_GO_INSTALLED:-/usr/local/go/bin/go} (where go.dev's tarball installs);
#   4. the toolchain fetched before: ${GPUPASS_LAB_CACHE:-~/.cache/gpupass-lab}/go1.26.8/go/bin/go.
# None: go1.26.8 is fetched as the go command itself fetches a toolchain for GOTOOLCHAIN: the
# module golang.org/toolchain@v0.0.1-go1.26.8.linux-amd64 from the Go module proxy (GOPROXY's
# first URL; default https://proxy.golang.org; file:// URLs too), its zip checked against the
# checksum database's h1: hash pinned below, unpacked into the cache (about 72 MB fetched,
# 240 MB unpacked). The zip stays in the cache as a proxy tree ($cache/goproxy/...), which
# tests/it/gotool.rs serves to the script again through GOPROXY=file://.
# GOPROXY=off (or no URL in it): nothing is fetched; exit 1 saying what to install.
#
# Needs python3 (the fetch, the hash, the unpacking). Exit status: 0 the path printed, 1 no usable
# Go (the message says what to install or set), 2 usage.
set -euo pipefail

WANT_MINOR=26 # go1.26 or newer
VERSION=go1.26.8
# golang.org/toolchain v0.0.1-go1.26.8.linux-amd64's hash in the Go checksum database
# (sum.golang.org, read through proxy.golang.org/sumdb/sum.golang.org/lookup/...).
H1=h1:ZOmGe1OnfREDMIdb1Qi4G9JSuDPBLGExZMQ4nis1RXM=
MODVER=v0.0.1-$VERSION.linux-amd64

die() { printf 'go.sh: %s\n' "$*" >&2; exit 1; }
[ $# -eq 0 ] || { echo "usage: lab/tools/go.sh (no arguments; see its header)" >&2; exit 2; }

cache=${GPUPASS_LAB_CACHE:-$HOME/.cache/gpupass-lab}
fetched=$cache/$VERSION/go/bin/go
install_hint="install Go 1.26 or newer from https://go.dev/dl/ (the tarball into /usr/local/go: \
tar -C /usr/local -xzf go1.26.8.linux-amd64.tar.gz), or set GO=/path/to/go; Debian 12's golang-go \
is 1.19, too old"

# version_of CMD: `go1.26.8` (what `go version` says), or nothing when it does not run. Run with
# GOTOOLCHAIN=local from /, so no go.mod around makes a go >= 1.21 switch toolchains.
version_of() {
  local out
  out=$(cd / && GOTOOLCHAIN=local "$1" version 2>/dev/null) || return 0
  # shellcheck disable=SC2086 # split into its words
  set -- $out
  if [ "${1:-}" = go ] && [ "${2:-}" = version ]; then echo "${3:-}"; fi
}
# new_enough go1.X.Y: whether X >= WANT_MINOR (go1 only; go2 would be newer).
new_enough() {
  [[ $1 =~ ^go1\.([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge $WANT_MINOR ]
}

if [ -n "${GO:-}" ]; then
  v=$(version_of "$GO")
  [ -n "$v" ] || die "GO=$GO does not run as a go command; $install_hint"
  new_enough "$v" || die "GO=$GO is $v, older than go1.$WANT_MINOR; $install_hint"
  command -v "$GO"
  exit 0
fi

seen=()
for cand in "$(command -v go || true)" "${GPUPASS_GO_INSTALLED:-/usr/local/go/bin/go}" "$fetched"; do
  [ -n "$cand" ] && [ -x "$cand" ] || continue
  v=$(version_of "$cand")
  if [ -n "$v" ] && new_enough "$v"; then
    echo "$cand"
    exit 0
  fi
  seen+=("$cand (${v:-does not run})")
done
found=${seen[*]:+: found ${seen[*]}}
found=${found:-: no go on PATH or in ${GPUPASS_GO_INSTALLED:-/usr/local/go/bin/go}}

# Fetch. The proxy: GOPROXY's first entry that is a URL (its list is split at , and |).
proxy=
IFS=',|' read -r -a entries <<< "${GOPROXY:-https://proxy.golang.org,direct}"
for e in "${entries[@]}"; do
  case $e in
    off) break ;;
    http://* | https://* | file://*) proxy=${e%/}; break ;;
  esac
done
[ -n "$proxy" ] || die "no Go 1.$WANT_MINOR$found; GOPROXY=${GOPROXY:-} gives no proxy URL to fetch $VERSION from; $install_hint"
[ "$(uname -m)" = x86_64 ] || die "no Go 1.$WANT_MINOR$found; this script fetches linux-amd64 only, this machine is $(uname -m); $install_hint"
command -v python3 >/dev/null || die "no Go 1.$WANT_MINOR$found; fetching $VERSION needs python3 (apt-get install python3) ; or $install_hint"

mkdir -p "$cache"
exec 9> "$cache/$VERSION.lock"
flock 9
if [ -x "$fetched" ] && new_enough "$(version_of "$fetched")"; then
  echo "$fetched" # fetched by another run while this one waited for the lock
  exit 0
fi
echo "go.sh: no Go 1.$WANT_MINOR$found; fetching $VERSION from $proxy into $cache/$VERSION" >&2
zip=$cache/goproxy/golang.org/toolchain/@v/$MODVER.zip
tmp=$cache/$VERSION.tmp
rm -rf "$tmp"
if ! python3 - "$proxy/golang.org/toolchain/@v/$MODVER.zip" "$zip" "$H1" "$tmp" <<'EOF'
import base64, hashlib, os, shutil, sys, urllib.request, zipfile
url, keep, want, dest = sys.argv[1:]
os.makedirs(os.path.dirname(keep), exist_ok=True)
part = keep + ".part"
# The zip kept from an earlier fetch is checked like a new one.
if not os.path.exists(keep):
    try:
        with urllib.request.urlopen(url, timeout=120) as r, open(part, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
    except Exception as e:
        sys.exit(f"go.sh: fetching {url}: {e}")
    os.replace(part, keep)
# The module zip's h1: hash (the checksum database's): SHA-256 over the lines
# "<sha256 hex of the file>  <name>\n" of every file, sorted by name, base64.
try:
    z = zipfile.ZipFile(keep)
    names = sorted(i.filename for i in z.infolist() if not i.is_dir())
    lines = "".join(f"{hashlib.sha256(z.read(n)).hexdigest()}  {n}\n" for n in names)
except (zipfile.BadZipFile, OSError) as e:
    os.remove(keep)
    sys.exit(f"go.sh: {url} is not a module zip ({e}); removed it")
got = "h1:" + base64.b64encode(hashlib.sha256(lines.encode()).digest()).decode()
if got != want:
    os.remove(keep)
    sys.exit(f"go.sh: checksum mismatch for {url}: {got}, the checksum database says {want}; removed it")
prefix = "golang.org/toolchain@" + os.path.basename(keep)[: -len(".zip")] + "/"
root = os.path.join(dest, "go")
for n in names:
    if not n.startswith(prefix) or ".." in n.split("/"):
        sys.exit(f"go.sh: unexpected file {n} in {url}")
    out = os.path.join(root, n[len(prefix):])
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "wb") as f:
        f.write(z.read(n))
# Module zips carry no modes: the go command makes these executable after its own fetch.
for sub in ("pkg/tool", "bin"):
    for d, _, files in os.walk(os.path.join(root, sub)):
        for f in files:
            os.chmod(os.path.join(d, f), 0o755)
for d, _, files in os.walk(os.path.join(root, "lib")):
    for f in files:
        if f.startswith("go_") and f.endswith("_exec"):
            os.chmod(os.path.join(d, f), 0o755)
EOF
then
  rm -rf "$tmp"
  die "could not fetch $VERSION (above); $install_hint"
fi
rm -rf "${cache:?}/$VERSION"
mv "$tmp" "$cache/$VERSION"
v=$(version_of "$fetched")
[ "$v" = "$VERSION" ] || die "the fetched $fetched says '${v:-nothing}', not $VERSION"
echo "$fetched"
