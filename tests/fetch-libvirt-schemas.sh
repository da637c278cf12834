#!/usr/bin/env bash
# Prints the directory of libvirt 12.9's RNG schemas (usr/share/libvirt/schemas of Debian
# trixie-backports' libvirt 12.9.0-1~bpo13+1: in 12.9 they ship in libvirt-common, in
# bookworm's 9.0 in libvirt0, so both packages are taken), fetching it on first use into the lab cache:
# `apt-get download` through lab/tools/aptfetch.sh's private apt state (a state dir of its own
# for the trixie suites, so bookworm's lists are not mixed in) and `dpkg -x`; nothing is
# installed. tests/it/vm_outputs.rs validates the iommufd XML against these schemas.
#
#   tests/fetch-libvirt-schemas.sh [CACHE]     (default $GPUPASS_LAB_CACHE or ~/.cache/gpupass-lab)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${1:-${GPUPASS_LAB_CACHE:-$HOME/.cache/gpupass-lab}}
ver=12.9.0-1~bpo13+1
dest=$cache/libvirt-schemas-$ver
schemas=$dest/usr/share/libvirt/schemas
if [[ -f $schemas/domain.rng ]]; then
  echo "$schemas"
  exit 0
fi
mkdir -p "$cache"
exec 9>"$dest.lock"
flock 9
if [[ ! -f $schemas/domain.rng ]]; then
  dl=$(mktemp -d "$cache/libvirt-dl.XXXXXX")
  trap 'rm -rf "$dl"' EXIT
  bash "$here/../lab/tools/aptfetch.sh" "$cache/apt-trixie" trixie-backports download "$dl" \
    "libvirt0=$ver" "libvirt-common=$ver"
  rm -rf "$dest.tmp"
  for deb in "$dl"/*.deb; do dpkg -x "$deb" "$dest.tmp"; done
  [[ -f $dest.tmp/usr/share/libvirt/schemas/domain.rng ]] || {
    echo "fetch-libvirt-schemas: libvirt0/libvirt-common $ver have no usr/share/libvirt/schemas/domain.rng" >&2
    exit 1
  }
  rm -rf "$dest"
  mv "$dest.tmp" "$dest"
fi
echo "$schemas"
