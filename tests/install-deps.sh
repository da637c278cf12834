#!/usr/bin/env bash
# Installs (as root, with apt) every Debian package the test suite needs on a fresh Debian 12
# machine, then makes sure of Go 1.26 (lab/tools/go.sh: the go on PATH or in /usr/local/go when
# it is 1.26 or newer, else go1.26.8 fetched from the Go module proxy into the lab cache; with
# GOPROXY=off and no such go it stops here, saying what to install). The README's test command
# and .ci/run both start with it; it does nothing when everything is present.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
need=()
# lab/tools/go.sh fetches Go with python3 over HTTPS (the system's CA certificates).
[ -f /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
# QEMU is not installed: the lab (and tests/it/vm_outputs.rs) unpack Debian's qemu-system-x86 10.0
# from bookworm-backports into the lab cache (lab/tools/qemu.sh), whatever QEMU the host has
# (none, Debian's 7.2, backports' 10.0: docs/testing.md); nothing here installs or removes QEMU.
# The lab's 6.12 kernel is built from linux-source-6.12 (lab/kernel/build.sh) with these:
for p in flex bison bc; do command -v $p >/dev/null || need+=($p); done
[ -f /usr/include/libelf.h ] || need+=(libelf-dev)
[ -f /usr/include/openssl/ssl.h ] || need+=(libssl-dev)
command -v xz >/dev/null || need+=(xz-utils)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
# tests/it/labtool.rs and the lab runner (lab/tools/labtool.py)
command -v python3 >/dev/null || need+=(python3)
command -v depmod >/dev/null || need+=(kmod)
command -v lspci >/dev/null || need+=(pciutils)
# Containers: podman + runc consume the CDI specs and run the OCI hook (tests/it/containers.rs,
# tests/it/oci_hook.rs); they fail, not skip, without them when CI=true.
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
# deploy/image/build.sh (tests/it/deploy.rs): `file` tells a static binary, `strip` strips it.
command -v file >/dev/null || need+=(file)
command -v strip >/dev/null || need+=(binutils)
# tests/it/bind.rs: Debian's driverctl reads the overrides `gpupass persist` writes; unshare (util-linux).
[ -x /usr/sbin/driverctl ] || need+=(driverctl)
command -v unshare >/dev/null || need+=(util-linux)
# tests/it/mdev.rs runs Debian's mdevctl (chrooted into fixture trees) for interop checks.
command -v mdevctl >/dev/null || need+=(mdevctl)
# tests/it/package.rs: contrib/package.sh's Debian package checked by lintian, its unit enabled
# in the throwaway root by systemd's own `systemctl --root` (dpkg comes with every Debian system).
command -v lintian >/dev/null || need+=(lintian)
command -v systemctl >/dev/null || need+=(systemd)
# VM outputs: libvirt's RNG schemas + virsh test driver (tests/it/vm_outputs.rs), and the libvirt
# API for `--features libvirt` (tests/it/vm_attach.rs).
command -v virt-xml-validate >/dev/null || need+=(libvirt-clients)
command -v virsh >/dev/null || need+=(libvirt-clients)
command -v xmllint >/dev/null || need+=(libxml2-utils)
command -v pkg-config >/dev/null || need+=(pkg-config)
[ -f /usr/include/libvirt/libvirt.h ] || need+=(libvirt-dev)
# libvirt's own QEMU driver turns the domain XML into a QEMU command line (tests/it/vm_outputs.rs:
# `virsh -c qemu:///session domxml-to-native`), with OVMF's firmware descriptors for
# <os firmware='efi'>.
[ -x /usr/sbin/libvirtd ] || need+=(libvirt-daemon)
[ -f /usr/lib/x86_64-linux-gnu/libvirt/connection-driver/libvirt_driver_qemu.so ] || need+=(libvirt-daemon-driver-qemu)
[ -f /usr/share/qemu/firmware/60-edk2-x86_64.json ] || need+=(ovmf)
# The cluster lab's runc is built with seccomp and linked statically (lab/cluster/build.sh,
# docs/cluster.md): libseccomp.a and seccomp.h.
[ -f /usr/include/seccomp.h ] || need+=(libseccomp-dev)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --no-remove "${need[@]}"
fi
# Go 1.26 for lab/cluster/build.sh and the Go helpers of tests/it (tests/cdi-validate,
# tests/dra-validate), which all find it through lab/tools/go.sh too.
go=$("$here/../lab/tools/go.sh") || {
  echo "install-deps: the tests need Go 1.26 or newer (above)" >&2
  exit 1
}
echo "install-deps: Go: $go ($(GOTOOLCHAIN=local "$go" env GOVERSION))"

