#!/usr/bin/env bash
# Build the release artifacts into target/package/:
#   gpupass-<version>-x86_64-linux   the static release binary (glibc linked in, not position-
#                                    independent: runs on any x86_64 Linux, starts cheapest)
#   gpupass_<version>-1_amd64.deb    the Debian package (Debian 12 and later), the same binary
#   SHA256SUMS
#
#   contrib/package.sh               # build both (cargo build, then dpkg-deb; lintian if present)
#   contrib/package.sh --bin-only    # only the static binary (benches/startup.sh)
#
# The binary: `cargo build --release --target x86_64-unknown-linux-gnu --features dra` with
# RUSTFLAGS `-C target-feature=+crt-static -C relocation-model=static` (what contrib/install.sh
# and the QEMU lab build, lab/lab.sh), stripped. Built with `dra`, one package for the host
# commands and the node plugin: the DRA kubelet plugin (kube-rs, k8s-openapi, rustls) doubles
# the stripped binary (18.4 MB against 9.3 MB without it) and adds 1-2 minor faults to
# `--version` (60-62 against 59-60) and 6 to the no-op OCI hook (106-108 against 100-101;
# `/usr/bin/time -f %R`, 3 runs each, 2026-12-06), so a second package would save disk, not
# start-up, and give nodes two binaries to keep in step. GPUPASS_PKG_FEATURES= builds without. The package holds: /usr/bin/gpupass; the boot unit (contrib/systemd, in
# /lib/systemd/system, not enabled); the udev rule (contrib/udev, /lib/udev/rules.d); the man
# page (`gpupass man`); bash, zsh and fish completions (`gpupass completions`); the copyright
# file (with the crates and glibc linked in), the changelog and README.Debian; lintian
# overrides for the static binary and for a package not uploaded to Debian. Its maintainer
# scripts
# reload systemd and udev and, on purge, remove the unit's enablement links; they honour
# $DPKG_ROOT (dpkg --root with --force-script-chrootless, tests/it/package.rs).
#
# gpupass has no configuration file. Its persistent state is driverctl overrides in
# /etc/driverctl.d and mdevctl definitions in /etc/mdevctl.d (shared with those tools, the
# admin's data: left on purge); its runtime state (the bind journal and lock) is /run/gpupass,
# made when first needed. None of these directories is in the package.
#
# Needs: cargo, dpkg-deb, gzip, strip (binutils); lintian to check the package (CI: required).
set -euo pipefail
cd "$(dirname "$0")/.."
bin_only=
case ${1:-} in
  --bin-only) bin_only=1 ;;
  "") ;;
  *) echo "usage: contrib/package.sh [--bin-only]" >&2; exit 2 ;;
esac
triple=x86_64-unknown-linux-gnu
features=${GPUPASS_PKG_FEATURES-dra}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
revision=1
tdir=${CARGO_TARGET_DIR:-target}
out=$tdir/package
mkdir -p "$out"
for t in cargo strip gzip; do
  command -v $t >/dev/null || { echo "contrib/package.sh: $t is missing" >&2; exit 1; }
done

RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C target-feature=+crt-static -C relocation-model=static" \
  cargo build --release --target $triple --bin gpupass ${features:+--features "$features"} >&2
staticbin=$out/gpupass-$version-x86_64-linux
strip --strip-all --remove-section=.comment -o "$staticbin.tmp" "$tdir/$triple/release/gpupass"
mv "$staticbin.tmp" "$staticbin"
"$staticbin" --version >/dev/null
if [ -n "$bin_only" ]; then
  echo "$staticbin"
  exit 0
fi
command -v dpkg-deb >/dev/null || { echo "contrib/package.sh: dpkg-deb is missing (apt-get install dpkg)" >&2; exit 1; }

# Reproducible: every date is the commit's (SOURCE_DATE_EPOCH, as Debian's builds do).
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
# The maintainer: GPUPASS_MAINTAINER, else the author of the commit built.
maint=${GPUPASS_MAINTAINER:-$(git log -1 --format='%an <%ae>' 2>/dev/null || echo 'gpupass <root@localhost>')}
root=$out/root
rm -rf "$root"
doc=$root/usr/share/doc/gpupass
install -d "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" "$root/lib/udev/rules.d" \
  "$root/usr/share/man/man1" "$root/usr/share/bash-completion/completions" \
  "$root/usr/share/zsh/vendor-completions" "$root/usr/share/fish/vendor_completions.d" \
  "$root/usr/share/lintian/overrides" "$doc"
install -m 0755 "$staticbin" "$root/usr/bin/gpupass"
subst() { sed "s|@BINDIR@|/usr/bin|g" "$1"; }
subst contrib/systemd/gpupass-startup.service >"$root/lib/systemd/system/gpupass-startup.service"
subst contrib/udev/90-gpupass.rules >"$root/lib/udev/rules.d/90-gpupass.rules"
chmod 0644 "$root/lib/systemd/system/gpupass-startup.service" "$root/lib/udev/rules.d/90-gpupass.rules"
"$staticbin" man | gzip -9n >"$root/usr/share/man/man1/gpupass.1.gz"
"$staticbin" completions bash >"$root/usr/share/bash-completion/completions/gpupass"
"$staticbin" completions zsh >"$root/usr/share/zsh/vendor-completions/_gpupass"
"$staticbin" completions fish >"$root/usr/share/fish/vendor_completions.d/gpupass.fish"

# Debian changelog: one entry for this build.
{
  echo "gpupass ($version-$revision) unstable; urgency=medium"
  echo
  echo "  * Built by contrib/package.sh from commit $commit."
  echo
  echo " -- $maint  $(date -u -R -d "@$SOURCE_DATE_EPOCH")"
} | gzip -9n >"$doc/changelog.Debian.gz"

# The copyright file: gpupass, and what the static binary links in.
pciids=$(cargo tree --offline --locked -e build --target $triple --prefix none --format '{p}' \
  2>/dev/null | grep -m1 '^pci-ids ' | sed 's/ (\*)$//' || true)
libc_src=$(dpkg-query -W -f='${source:Package} (= ${source:Version})' libc6-dev 2>/dev/null || true)
{
  cat <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: gpupass
Comment: /usr/bin/gpupass is linked statically. Besides gpupass it holds the GNU C
 Library (${libc_src:-glibc}; LGPL-2.1+, /usr/share/common-licenses/LGPL-2.1) and the Rust
 crates below (name version: license, from Cargo.lock by cargo tree), each under the
 license its crate states; and the PCI ID database (pci.ids) of the pci-ids crate
 ($pciids; the crate MIT, the database GPL-2+ or BSD-3-Clause), which build.rs
 writes into the binary.
 .
EOF
  cargo tree --offline --locked -e normal,no-proc-macro --target $triple \
    ${features:+--features "$features"} --prefix none --format '{p}: {l}' 2>/dev/null |
    sed -e 's/ (\*)$//' -e 's| (/[^)]*)||' -e '/^gpupass /d' -e 's/^/ /' | LC_ALL=C sort -u
  cat <<EOF

Files: *
Copyright: $(date -u -d "@$SOURCE_DATE_EPOCH" +%Y) the gpupass authors
License: Apache-2.0

License: Apache-2.0
 Licensed under the Apache License, Version 2.0 (the "License"); you may not use this
 file except in compliance with the License. You may obtain a copy of the License at
 https://www.apache.org/licenses/LICENSE-2.0
 .
 Unless required by applicable law or agreed to in writing, software distributed under
 the License is distributed on an "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY
 KIND, either express or implied. See the License for the specific language governing
 permissions and limitations under the License.
 .
 On Debian systems, the complete text of the Apache License, Version 2.0 can be found in
 /usr/share/common-licenses/Apache-2.0.
EOF
} >"$doc/copyright"

cat >"$doc/README.Debian" <<'EOF'
gpupass for Debian
==================

Boot unit: gpupass-startup.service re-applies persistent VFIO binds (`gpupass persist`,
driverctl overrides in /etc/driverctl.d) and starts the `auto` mdev definitions
(/etc/mdevctl.d) early at boot. It is installed but not enabled:

    systemctl enable gpupass-startup.service

The udev rule (/lib/udev/rules.d/90-gpupass.rules) does the same for functions and mdev
parents that appear later.

Files: gpupass has no configuration file. Persistent state is the driverctl overrides and
mdevctl definitions above (shared with driverctl and mdevctl; purging gpupass leaves them).
The bind journal and its lock are in /run/gpupass, made when first needed.

The binary is linked statically (glibc included) and is not position-independent: no dynamic
loader runs at its start, which the OCI hook pays at every container start (`gpupass
--version`: 34 minor page faults, against 145 for a dynamically linked PIE build of the same
code). The same binary is released on its own as gpupass-<version>-x86_64-linux.
EOF
gzip -9n "$doc/README.Debian"

cat >"$root/usr/share/lintian/overrides/gpupass" <<'EOF'
# The binary is static on purpose (contrib/package.sh, README.Debian): glibc is recorded in
# Built-Using and the copyright file.
gpupass: statically-linked-binary [usr/bin/gpupass]
# Built from the gpupass tree, not uploaded to Debian: there is no ITP bug to close.
gpupass: initial-upload-closes-no-bugs [usr/share/doc/gpupass/changelog.Debian.gz:1]
EOF

# Maintainer scripts: reload systemd and udev on the host (never under $DPKG_ROOT), and on
# purge remove the links `systemctl enable` made, so that nothing of the package is left.
cat >"$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -z "$DPKG_ROOT" ]; then
	if [ -d /run/systemd/system ]; then
		systemctl --system daemon-reload >/dev/null || true
	fi
	if command -v udevadm >/dev/null 2>&1; then
		udevadm control --reload-rules >/dev/null 2>&1 || true
	fi
fi
EOF
cat >"$root/DEBIAN/postrm" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = purge ]; then
	rm -f "$DPKG_ROOT/etc/systemd/system/sysinit.target.wants/gpupass-startup.service"
	rmdir --ignore-fail-on-non-empty "$DPKG_ROOT/etc/systemd/system/sysinit.target.wants" 2>/dev/null || true
fi
if [ "$1" = remove ] || [ "$1" = purge ]; then
	if [ -z "$DPKG_ROOT" ] && [ -d /run/systemd/system ]; then
		systemctl --system daemon-reload >/dev/null || true
	fi
fi
EOF
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/postrm"

size=$(du -k -s --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<EOF
Package: gpupass
Version: $version-$revision
Architecture: amd64
Maintainer: $maint
Installed-Size: $size
${libc_src:+Built-Using: $libc_src
}Section: admin
Priority: optional
Suggests: driverctl, mdevctl, qemu-system-x86, libvirt-daemon-system, podman
Description: move GPUs and other PCI devices into VMs and containers
 gpupass reads the host's PCI devices, IOMMU groups, drivers and mediated
 devices from sysfs, binds devices to vfio-pci with a journal (and gives them
 back), creates mdev and NVIDIA vGPU instances, and writes what VMs and
 containers need: libvirt XML, QEMU arguments, CDI specs, an OCI runtime hook,
 a Kubernetes device plugin and a DRA kubelet plugin. One static binary; a boot
 unit and a udev rule re-apply persistent binds and mdev definitions.
EOF
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
  xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
deb=$out/gpupass_$version-${revision}_amd64.deb
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >&2
(cd "$out" && sha256sum "$(basename "$staticbin")" "$(basename "$deb")" >SHA256SUMS)
if command -v lintian >/dev/null; then
  lintian --fail-on error,warning "$deb" >&2
elif [ "${CI:-}" = true ]; then
  echo "contrib/package.sh: lintian is missing (apt-get install lintian)" >&2
  exit 1
fi
echo "$deb"
