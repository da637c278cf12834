#!/usr/bin/env bash
# Build the lab's 6.12 kernel (iommufd, VFIO cdev, legacy container, cgroup v2
# + BPF, the mdev samples) from Debian's own source package linux-source-6.12.
#
#   lab/kernel/build.sh CACHE_ROOT    prints the cache entry directory on stdout
#
# The entry is keyed by the source version and the sha256 of the config
# fragment and $SCHEME below, so a change to either builds anew; an entry is
# complete when it holds .complete.  Layout (what lab.sh expects of any
# kernel entry): vmlinux, config, modules/lib/modules/<release>/ (the module
# pool, with modules.dep), samples/*.ko, release; and bzImage (the same kernel
# with the x86 boot protocol and the EFI stub, for the L2 Linux of l2linux).
#
# Host packages (installed by lab.sh / tests/install-deps.sh): gcc make bc
# flex bison libelf-dev libssl-dev xz-utils.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE_ROOT=$1
FRAG=$HERE/lab-6.12.config
log() { printf 'lab: kernel 6.12: %s\n' "$*" >&2; }
die() { printf 'lab: error: kernel 6.12: %s\n' "$*" >&2; exit 2; }

state=$CACHE_ROOT/apt
# bookworm-backports ships linux-source-6.12; bookworm-security carries newer
# 6.12 stable updates of the same package.  Take the newest either offers.
ver=${GPUPASS_LAB_KSRC_VERSION:-$(APTFETCH_MATCH=bookworm "$HERE/../tools/aptfetch.sh" "$state" bookworm-backports version linux-source-6.12)}
[[ -n $ver ]] || die "no linux-source-6.12 in bookworm-backports or bookworm-security"
# Bump SCHEME when a change to this script changes what it builds.
SCHEME=2
key=$( (cat "$FRAG"; echo "scheme $SCHEME") | sha256sum | cut -c1-12)
entry=$CACHE_ROOT/lab-6.12_${ver}_$key
if [[ -f $entry/.complete ]]; then echo "$entry"; exit 0; fi
mkdir -p "$entry"
exec 9>"$entry.lock"
flock 9
if [[ -f $entry/.complete ]]; then echo "$entry"; exit 0; fi

t0=$(date +%s)
src=$CACHE_ROOT/src-6.12_$ver
if [[ ! -f $src/.unpacked ]]; then
  log "downloading linux-source-6.12 $ver (~150 MB)"
  "$HERE/../tools/aptfetch.sh" "$state" bookworm-backports download "$src/debs" "linux-source-6.12=$ver"
  log "unpacking"
  rm -rf "$src/deb" "$src/linux"
  dpkg -x "$src"/debs/linux-source-6.12_*.deb "$src/deb"
  mkdir -p "$src/linux"
  tar -xf "$src/deb/usr/src/linux-source-6.12.tar.xz" -C "$src/linux" --strip-components=1
  rm -rf "$src/deb" "$src/debs"
  touch "$src/.unpacked"
fi

# The object tree lives beside the entries, per source version: a fragment
# change rebuilds only what changed (about a minute) when it is kept.
obj=$CACHE_ROOT/obj-6.12_$ver
mkdir -p "$obj"
# Entries of different keys share the object tree: one make in it at a time.
exec 8>"$obj.lock"
flock 8
log "configuring (x86_64_defconfig + kvm_guest.config + $(basename "$FRAG"))"
make -s -C "$src/linux" O="$obj" x86_64_defconfig >&2
kvmcfg=$src/linux/kernel/configs/kvm_guest.config
[[ -f $kvmcfg ]] || kvmcfg=$src/linux/arch/x86/configs/kvm_guest.config
"$src/linux/scripts/kconfig/merge_config.sh" -m -O "$obj" "$obj/.config" "$kvmcfg" "$FRAG" >/dev/null
make -s -C "$src/linux" O="$obj" olddefconfig >&2
# Every option of the fragment must have survived olddefconfig.
bad=0
while IFS= read -r line; do
  case $line in
    CONFIG_*=*) want=$line ;;
    "# CONFIG_"*" is not set") want=$line ;;
    *) continue ;;
  esac
  opt=${want#\# }; opt=${opt%%[= ]*}
  have=$(grep -E "^($opt=|# $opt is not set)" "$obj/.config" || echo "# $opt is not set")
  if [[ $have != "$want" ]]; then
    log "config: wanted '$want', got '$have'"; bad=1
  fi
done <"$FRAG"
((bad == 0)) || die "the fragment's options did not all survive olddefconfig (see above)"

log "building vmlinux, bzImage and modules with make -j$(nproc) (fresh: ~25 min on 2 cores)"
make -s -C "$src/linux" O="$obj" -j"$(nproc)" vmlinux bzImage modules >&2
rel=$(cat "$obj/include/config/kernel.release")
log "installing modules of $rel"
rm -rf "$entry/modules"
make -s -C "$src/linux" O="$obj" INSTALL_MOD_PATH="$entry/modules" INSTALL_MOD_STRIP=1 \
  DEPMOD=/sbin/depmod modules_install >&2
rm -f "$entry/modules/lib/modules/$rel/build" "$entry/modules/lib/modules/$rel/source"
mkdir -p "$entry/samples"
find "$entry/modules/lib/modules/$rel/kernel/samples" -name '*.ko' -exec cp {} "$entry/samples/" \;
cp "$obj/vmlinux" "$entry/vmlinux"
cp "$obj/arch/x86/boot/bzImage" "$entry/bzImage"
strip --strip-debug "$entry/vmlinux" 2>/dev/null || true
cp "$obj/.config" "$entry/config"
echo "$rel" >"$entry/release"
# GPUPASS_LAB_KEEP_OBJ=1 keeps the object tree (~1.5 GB) for quick rebuilds.
if [[ -z ${GPUPASS_LAB_KEEP_OBJ:-} ]]; then rm -rf "$obj"; fi
echo "$rel $ver $key built in $(($(date +%s) - t0)) s" >"$entry/.complete"
log "built $rel in $(($(date +%s) - t0)) s"
echo "$entry"
