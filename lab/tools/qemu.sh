#!/usr/bin/env bash
# The lab's QEMU: Debian's qemu-system-x86 10.0 from bookworm-backports
# (iommufd needs QEMU 8.2+; bookworm's own is 7.2), with the libraries the
# system lacks, unpacked into the lab cache.  Nothing is installed and the
# system's apt configuration is never touched, so no preinstalled package is
# ever removed, and whatever QEMU the host has (none, Debian's 7.2,
# backports' 10.0) the tree is the same build throughout:
#  - the QEMU packages are always fetched, even when the system has them;
#  - every loadable module of the build is in the tree (the module packages
#    are fetched without their libraries): QEMU looks for a module in
#    QEMU_MODULE_DIR first and only then in its compiled-in directory,
#    /usr/lib/x86_64-linux-gnu/qemu, where another build's module makes it
#    abort ("Only modules from the same build can be loaded", then
#    `Assertion QTAILQ_EMPTY(&dso_init_list)` in module_load_dso, as libvirt's
#    qom-list-types probe does); a module whose library is missing fails to
#    open, cleanly, in our directory and the search stops there;
#  - the tree is checked with that probe when fetched, and again before a use
#    whenever dpkg's status changed since the last pass.
#
#   lab/tools/qemu.sh prepare CACHE_ROOT     print the path of the qemu-system-x86_64 wrapper
#   lab/tools/qemu.sh carry CACHE_ROOT ROOT  copy QEMU, its libraries and firmware into
#                                            the initramfs tree ROOT (/opt/qemu/bin/...)
#
# GPUPASS_LAB_QEMU=/path/to/qemu-system-x86_64 uses another QEMU instead.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
action=$1 CACHE_ROOT=$2
SUITE=bookworm-backports
# Bumped when the tree's contents change, so older cache entries are refetched.
LAYOUT=2
# Packages of the QEMU build itself (PKG=VER with the build's version): the
# first are resolved with their dependencies, the module packages are fetched
# alone (their GUI/OpenGL/SPICE libraries are not needed by the lab).
BUILD_PACKAGES=(qemu-system-x86 qemu-system-common qemu-system-data)
MODULE_PACKAGES=(qemu-system-modules-opengl qemu-system-modules-spice qemu-system-gui qemu-block-extra)
FIRMWARE_PACKAGES=(seabios ipxe-qemu)

# The probe libvirt runs first: every QOM type, which loads every module.
# Exit 0 and a type list, or the QEMU's own words.
probe() { # WRAPPER
  local out
  out=$(printf '%s\n' '{"execute":"qmp_capabilities"}' '{"execute":"qom-list-types"}' '{"execute":"quit"}' |
    timeout 60 "$1" -M none -nodefaults -display none -qmp stdio 2>&1) &&
    [[ $out == *'"name": "vfio-pci"'* ]] && return 0
  printf '%s\n' "$out" | grep -v '^{"return"' | tail -20 >&2
  return 1
}
log() { printf 'lab: qemu: %s\n' "$*" >&2; }
die() { printf 'lab: error: qemu: %s\n' "$*" >&2; exit 2; }

prepare() {
  if [[ -n ${GPUPASS_LAB_QEMU:-} ]]; then echo "$GPUPASS_LAB_QEMU"; return; fi
  local state=$CACHE_ROOT/apt ver entry
  # A complete entry is used without asking apt (offline re-runs).
  entry=$(ls -d "$CACHE_ROOT"/qemu-*-l$LAYOUT/.complete 2>/dev/null | sort -V | tail -1 || true)
  if [[ -n $entry && -z ${GPUPASS_LAB_QEMU_REFRESH:-} ]]; then
    # The libraries taken from the system may have gone since (a package
    # removed): the probe says so, and the entry is fetched again.
    # The probe is run again only when dpkg's status changed since it last
    # passed (tests ask for the wrapper many times a run).
    local dir seen
    dir=$(dirname "$entry") seen=$(stat -c %Y /var/lib/dpkg/status 2>/dev/null || echo none)
    if [[ $(cat "$dir/.probed" 2>/dev/null) == "$seen" ]] ||
      { probe "$dir/bin/qemu-system-x86_64" 2>/dev/null && echo "$seen" >"$dir/.probed"; }; then
      echo "$dir/bin/qemu-system-x86_64"; return
    fi
    log "the cached QEMU in $dir no longer runs here; fetching it again"
    rm -f "$entry" "$dir/.probed"
  fi
  ver=$("$HERE/aptfetch.sh" "$state" $SUITE version qemu-system-x86)
  [[ -n $ver ]] || die "no qemu-system-x86 in $SUITE"
  entry=$CACHE_ROOT/qemu-${ver//[:~+]/_}-l$LAYOUT
  mkdir -p "$CACHE_ROOT"
  exec 7>"$entry.lock"
  flock 7
  if [[ ! -f $entry/.complete ]]; then
    local t0; t0=$(date +%s)
    log "fetching qemu-system-x86 $ver and the libraries this system lacks from $SUITE"
    rm -rf "$entry"; mkdir -p "$entry/debs" "$entry/root" "$entry/bin"
    local p named=() extra=()
    for p in "${BUILD_PACKAGES[@]}"; do named+=("$p=$ver"); done
    for p in "${MODULE_PACKAGES[@]}"; do extra+=("$p=$ver"); done
    "$HERE/aptfetch.sh" "$state" $SUITE closure "$entry/debs" "${named[@]}" "${FIRMWARE_PACKAGES[@]}" \
      -- "${extra[@]}" >"$entry/packages" || die "could not fetch QEMU $ver from $SUITE (aptfetch's message is above)"
    local d
    for d in "$entry"/debs/*.deb; do dpkg -x "$d" "$entry/root"; done
    rm -rf "$entry/debs" "$entry/root/usr/share/doc" "$entry/root/usr/share/man"
    # The wrapper finds everything relative to itself, so the same tree
    # works when copied into the lab guest (busybox sh).
    cat >"$entry/bin/qemu-system-x86_64" <<'WRAP'
#!/bin/sh
r=$(cd "$(dirname "$0")/../root" && pwd)
LD_LIBRARY_PATH=$r/usr/lib/x86_64-linux-gnu:$r/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
QEMU_MODULE_DIR=$r/usr/lib/x86_64-linux-gnu/qemu \
  exec "$r/usr/bin/qemu-system-x86_64" -L "$r/usr/share/qemu" -L "$r/usr/share/seabios" \
  -L "$r/usr/lib/ipxe/qemu" "$@"
WRAP
    chmod +x "$entry/bin/qemu-system-x86_64"
    "$entry/bin/qemu-system-x86_64" --version >&2 || die "the unpacked QEMU does not run"
    probe "$entry/bin/qemu-system-x86_64" ||
      die "the unpacked QEMU fails libvirt's qom-list-types probe (its output is above)"
    echo "$ver fetched in $(($(date +%s) - t0)) s" >"$entry/.complete"
    log "qemu $ver ready in $(($(date +%s) - t0)) s ($(du -sh "$entry" | cut -f1))"
  fi
  echo "$entry/bin/qemu-system-x86_64"
}

carry() { # ROOT: copy the QEMU tree and the system libraries it links into ROOT
  local root=$3 wrapper entry lib
  wrapper=$(prepare)
  entry=$(dirname "$(dirname "$wrapper")")
  mkdir -p "$root/opt/qemu"
  cp -a "$entry/bin" "$entry/root" "$root/opt/qemu/"
  # Only what the lab's guests use: drop other architectures' firmware.
  rm -f "$root"/opt/qemu/root/usr/share/qemu/{openbios-*,u-boot*,skiboot.lid,slof.bin,s390-*,hppa-*,palcode-*,*.dtb,npcm*}
  local r=$entry/root
  for lib in $(LD_LIBRARY_PATH=$r/usr/lib/x86_64-linux-gnu:$r/lib/x86_64-linux-gnu \
    ldd "$r/usr/bin/qemu-system-x86_64" | grep -o '/[^ ]*' | grep -v "^$r"); do
    [[ -e $root$lib ]] || cp -L --parents "$lib" "$root"
  done
}

case $action in
  prepare) prepare ;;
  carry) carry "$@" ;;
  *) die "unknown action $action" ;;
esac
