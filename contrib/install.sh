#!/usr/bin/env bash
# Install gpupass with its boot unit and udev rule:   sudo contrib/install.sh
# This is the from-source path; contrib/package.sh builds the Debian package and the static
# release binary (the same build as below, with the `dra` feature).
#   PREFIX=/usr/local (binary in $PREFIX/bin), DESTDIR= (staging root), NO_BUILD=1 to skip the build,
#   GPUPASS_BIN_PATH=FILE to install a binary built elsewhere, GPUPASS_DYNAMIC=1 for the default
#   (PIE, dynamically linked) build instead of the static one, NO_ENABLE=1 to skip `systemctl enable` (done only when systemd runs and DESTDIR is empty).
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
bindir=$PREFIX/bin
# The binary installed is static and not position-independent: in the default (PIE, dynamic)
# build the loader applies ~55,000 relocations, mostly the pci.ids tables, at every start, which
# made the OCI hook take 2.9 ms per container start instead of 1.45 ms (docs/performance.md).
# GPUPASS_DYNAMIC=1 installs the default build instead.
if [ -z "${GPUPASS_DYNAMIC:-}" ]; then
  triple=$(rustc -vV | sed -n 's/^host: //p')
  built=target/$triple/release/gpupass
  [ -n "${NO_BUILD:-}" ] || RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C target-feature=+crt-static -C relocation-model=static" \
    cargo build --release --target "$triple" --bin gpupass
else
  built=target/release/gpupass
  [ -n "${NO_BUILD:-}" ] || cargo build --release --bin gpupass
fi
install -D -m 0755 "${GPUPASS_BIN_PATH:-$built}" "$DESTDIR$bindir/gpupass"
subst() { sed "s|@BINDIR@|$bindir|g" "$1"; }
install -d "$DESTDIR/etc/systemd/system" "$DESTDIR/etc/udev/rules.d" \
  "$DESTDIR/usr/share/man/man1" "$DESTDIR/usr/share/bash-completion/completions" \
  "$DESTDIR/usr/share/zsh/vendor-completions" "$DESTDIR/usr/share/fish/vendor_completions.d"
subst contrib/systemd/gpupass-startup.service > "$DESTDIR/etc/systemd/system/gpupass-startup.service"
subst contrib/udev/90-gpupass.rules > "$DESTDIR/etc/udev/rules.d/90-gpupass.rules"
"$DESTDIR$bindir/gpupass" man > "$DESTDIR/usr/share/man/man1/gpupass.1"
"$DESTDIR$bindir/gpupass" completions bash > "$DESTDIR/usr/share/bash-completion/completions/gpupass"
"$DESTDIR$bindir/gpupass" completions zsh > "$DESTDIR/usr/share/zsh/vendor-completions/_gpupass"
"$DESTDIR$bindir/gpupass" completions fish > "$DESTDIR/usr/share/fish/vendor_completions.d/gpupass.fish"
if [ -z "$DESTDIR" ] && [ -z "${NO_ENABLE:-}" ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  systemctl enable gpupass-startup.service
  udevadm control --reload 2>/dev/null || true
fi
echo "installed gpupass to $DESTDIR$bindir, unit gpupass-startup.service, rule 90-gpupass.rules"
