#!/usr/bin/env bash
# gpupass QEMU IOMMU lab: boots a real Debian kernel under QEMU (TCG, q35,
# emulated Intel IOMMU) with a set of emulated GPUs and runs scenario scripts
# inside it.  See docs/lab.md for the device map and the guest protocol.
#
#   lab/lab.sh [--kernel 6.1|6.12] COMMAND ...
#
#   --kernel 6.1    Debian 12's kernel package (default): cgroup v1 devices,
#                   legacy VFIO container only
#   --kernel 6.12   the lab's own build of Debian's linux-source-6.12
#                   (lab/kernel/): iommufd, VFIO device cdev and the legacy
#                   container, unified cgroup v2 hierarchy only
#
#   lab/lab.sh run SCENARIO [SCENARIO...]   one boot, scenarios run in order
#   lab/lab.sh demo                          the whole job on the real kernel, streamed:
#                                            inventory, check, bind, VM outputs, boot through
#                                            VFIO, an mdev, CDI, unbind; a summary table
#   lab/lab.sh prepare                       packages + kernel cache only
#   lab/lab.sh shell                         interactive busybox shell in the guest
#   lab/lab.sh list                          scenarios available
#
# Environment:
#   GPUPASS_LAB_CACHE   cache root (default ~/.cache/gpupass-lab)
#   GPUPASS_LAB_OUT     result root (default <repo>/target/lab/out, <repo>/target/lab/out-6.12)
#   GPUPASS_LAB_QEMU    use this qemu-system-x86_64 instead of the cached Debian 10.0
#   GPUPASS_LAB_BIN     use this gpupass binary instead of building one
#   GPUPASS_LAB_JUDGE   use this labjudge binary (lab/judge) instead of building one
#   GPUPASS_LAB_PROFILE cargo profile of the guest's gpupass (default lab: release at
#                       opt-level 1, quick to build; release for benchmarks)
#   GPUPASS_LAB_KERNEL  use this cache entry (<release>_<debversion>) without asking apt
#   GPUPASS_LAB_TIMEOUT base wall-clock limit per boot in seconds (default 240)
#   GPUPASS_LAB_UPDATE_FIXTURE=1   the snapshot scenario rewrites tests/fixtures/hosts/qemu-lab
#   GPUPASS_LAB_QUIET=1 do not stream the guest console to the terminal
set -euo pipefail

LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$LAB_DIR")
CACHE_ROOT=${GPUPASS_LAB_CACHE:-$HOME/.cache/gpupass-lab}
# Kernel leg: 6.1 (Debian 12's package) or 6.12 (built by lab/kernel/build.sh).
LEG=6.1
if [[ ${1:-} == --kernel ]]; then
  LEG=${2:-}; shift 2 || true
elif [[ ${1:-} == --kernel=* ]]; then
  LEG=${1#--kernel=}; shift
fi
case $LEG in
  6.1 | 6.12) ;;
  *) printf 'lab: error: --kernel takes 6.1 or 6.12, not "%s"\n' "$LEG" >&2; exit 2 ;;
esac
if [[ $LEG == 6.1 ]]; then
  OUT_ROOT=${GPUPASS_LAB_OUT:-$REPO/target/lab/out}
else
  OUT_ROOT=${GPUPASS_LAB_OUT:-$REPO/target/lab/out-$LEG}
fi
BASE_TIMEOUT=${GPUPASS_LAB_TIMEOUT:-240}
TARGET_TRIPLE=x86_64-unknown-linux-gnu

# Modules every boot loads, in this order (name [params]).  Display and audio
# drivers first so there is something to unbind; then VFIO; then mdev and the
# kernel's sample mdev drivers; then kvm-amd for nested VMM tests.
BASE_MODULES=(
  "bochs"
  "virtio_pci"
  "virtio-gpu"
  "snd-hda-intel"
  "vfio"
  "vfio_iommu_type1"
  "vfio-pci"
  "mdev"
  "mbochs count=128"
  "mdpy"
  "mtty"
  "kvm-amd nested=1"
)
SAMPLE_MODULES=(mtty mdpy mdpy-fb mbochs)

# Host packages the lab needs: "command-or-path package".
HOST_PACKAGES=(
  "/bin/busybox busybox-static"
  "cpio cpio"
  "depmod kmod"
  "xz xz-utils"
  "python3 python3"
  "gcc gcc"
  "make make"
  "timeout coreutils"
  "lspci pciutils"
  "openssl openssl"
)
# The 6.12 leg builds its kernel: Kbuild's host tools.
KBUILD_PACKAGES=(
  "flex flex"
  "bison bison"
  "bc bc"
  "/usr/include/libelf.h libelf-dev"
  "/usr/include/openssl/ssl.h libssl-dev"
)

log() { printf 'lab: %s\n' "$*" >&2; }
die() { printf 'lab: error: %s\n' "$*" >&2; exit 2; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }

# --------------------------------------------------------------------------
# host packages

APT_UPDATED=0
apt_update_once() {
  if [[ $APT_UPDATED == 0 ]]; then
    log "apt-get update"
    apt-get -o DPkg::Lock::Timeout=300 update -qq >&2 || die "apt-get update failed"
    APT_UPDATED=1
  fi
}

need_root_for() {
  [[ $(id -u) == 0 ]] || die "$1 needs root (run as root, or install: $2)"
}

ensure_packages() {
  local missing=() entry cmd pkg entries=("${HOST_PACKAGES[@]}")
  [[ $LEG == 6.12 ]] && entries+=("${KBUILD_PACKAGES[@]}")
  for entry in "${entries[@]}"; do
    cmd=${entry% *} pkg=${entry#* }
    if [[ $cmd == /usr/include/* ]]; then
      [[ -f $cmd ]] || missing+=("$pkg")
    elif [[ $cmd == /* ]]; then
      # busybox must be the static build: the initramfs has no libc.
      dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || missing+=("$pkg")
    else
      command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
    fi
  done
  # zstd only if the kernel turns out to need it; lz4 likewise (checked later).
  if ((${#missing[@]})); then
    need_root_for "installing ${missing[*]}" "apt-get install ${missing[*]}"
    apt_update_once
    log "apt-get install ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq \
      --no-install-recommends --no-remove "${missing[@]}" >&2 ||
      die "apt-get install ${missing[*]} failed (the lab never lets apt remove packages; resolve the conflict by hand)"
  fi
}

# --------------------------------------------------------------------------
# QEMU: Debian's 10.0 from bookworm-backports, unpacked into the cache
# (lab/tools/qemu.sh); never installed, so nothing the machine has is removed.

QEMU_BIN=''
prepare_qemu() {
  [[ -n $QEMU_BIN ]] && return
  local t0; t0=$(now)
  QEMU_BIN=$("$LAB_DIR/tools/qemu.sh" prepare "$CACHE_ROOT") || die "could not prepare the lab's QEMU"
  log "qemu: $("$QEMU_BIN" --version | head -1) ($(elapsed "$t0") s)"
}

# --------------------------------------------------------------------------
# kernel: resolve, download, unpack, extract, build samples (cached)

KREL='' KVER='' KDIR=''

resolve_kernel() {
  if [[ -n ${GPUPASS_LAB_KERNEL:-} ]]; then
    KDIR=$CACHE_ROOT/$GPUPASS_LAB_KERNEL
    [[ -f $KDIR/.complete ]] || die "GPUPASS_LAB_KERNEL=$GPUPASS_LAB_KERNEL: no complete cache entry at $KDIR"
    KREL=${GPUPASS_LAB_KERNEL%%_*} KVER=${GPUPASS_LAB_KERNEL#*_}
    return
  fi
  local img
  img=$(apt-cache depends linux-image-amd64 2>/dev/null |
    awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ {print $2; exit}')
  [[ -n $img ]] || die "apt-cache cannot resolve linux-image-amd64 (no Debian apt sources?)"
  KREL=${img#linux-image-}
  KVER=$(apt-cache show --no-all-versions "$img" 2>/dev/null | awk '$1 == "Version:" {print $2; exit}')
  [[ -n $KVER ]] || die "apt-cache has no version for $img"
  KDIR=$CACHE_ROOT/${KREL}_${KVER}
}

# apt-get download PKG=VER... into the current directory.
download_debs() {
  # Sandbox user root: the cache dir is not readable by _apt.
  apt-get -o DPkg::Lock::Timeout=300 -o APT::Sandbox::User=root download -qq "$@" >&2
}

prepare_kernel() {
  mkdir -p "$CACHE_ROOT"
  if [[ $LEG == 6.12 ]]; then
    local t0; t0=$(now)
    KDIR=$("$LAB_DIR/kernel/build.sh" "$CACHE_ROOT") || die "could not build the lab's 6.12 kernel"
    KREL=$(cat "$KDIR/release") KVER=$(basename "$KDIR")
    log "kernel $KREL (lab build $(basename "$KDIR")) in $(elapsed "$t0") s"
    return
  fi
  resolve_kernel
  if [[ -f $KDIR/.complete ]]; then
    log "kernel $KREL ($KVER) from cache $KDIR"
    return
  fi
  # The mirror keeps only the newest kernel; stale apt lists name one that is
  # gone.  Try once with the lists we have, then refresh and resolve again.
  local t0 rc=0; t0=$(now)
  _prepare_kernel_locked || rc=$?
  if ((rc != 0)); then
    if [[ $rc == 3 && $APT_UPDATED == 0 && $(id -u) == 0 ]]; then
      log "download failed; refreshing apt lists and resolving the kernel again"
      apt_update_once
      resolve_kernel
      [[ -f $KDIR/.complete ]] || _prepare_kernel_locked || die "could not prepare kernel $KREL ($KVER)"
    else
      die "could not prepare kernel $KREL ($KVER)"
    fi
  fi
  log "kernel $KREL ($KVER) prepared in $(elapsed "$t0") s"
}

_prepare_kernel_locked() {
  mkdir -p "$KDIR"
  (
    flock 9
    [[ -f $KDIR/.complete ]] && exit 0
    _prepare_kernel
  ) 9>"$KDIR.lock"
}

_prepare_kernel() {
  local xy
  xy=$(cut -d. -f1,2 <<<"$KVER")
  local abi=${KREL%-amd64}
  local scratch=$KDIR/scratch
  rm -rf "$scratch"
  mkdir -p "$KDIR/debs" "$scratch"
  log "downloading kernel $KREL $KVER (image, headers, kbuild, source ~220 MB)"
  (
    cd "$KDIR/debs"
    local p want=()
    for p in "linux-image-$KREL" "linux-headers-$KREL" "linux-headers-$abi-common" \
      "linux-kbuild-$xy" "linux-source-$xy"; do
      ls "${p}_${KVER}"_*.deb >/dev/null 2>&1 || want+=("$p=$KVER")
    done
    ((${#want[@]} == 0)) || download_debs "${want[@]}"
  ) || return 3

  log "unpacking kernel image"
  dpkg -x "$KDIR/debs/linux-image-${KREL}_${KVER}"_*.deb "$scratch/img"
  local vmlinuz=$scratch/img/boot/vmlinuz-$KREL
  [[ -f $vmlinuz ]] || { log "no $vmlinuz in the image package"; return 1; }
  cp "$scratch/img/boot/config-$KREL" "$KDIR/config"
  if grep -q '^CONFIG_KERNEL_ZSTD=y' "$KDIR/config" && ! command -v zstd >/dev/null; then
    need_root_for "installing zstd" "apt-get install zstd"; apt_update_once
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-remove zstd >&2
  fi
  python3 "$LAB_DIR/tools/extract-vmlinux.py" "$vmlinuz" "$KDIR/vmlinux" || return 1

  # Keep the kernel's module tree metadata and the modules themselves
  # decompressed in a "pool" from which each run takes its closure.  We keep
  # only what some boot may ask for: the base set plus everything the shipped
  # scenarios declare, and their dependencies.
  log "extracting module subset"
  rm -rf "$KDIR/modules"
  # The package ships no modules.dep (dpkg's postinst runs depmod): make one.
  depmod -b "$scratch/img" "$KREL" || return 1
  local wanted; mapfile -t wanted < <(all_wanted_module_names)
  python3 "$LAB_DIR/tools/labtool.py" modules \
    --src "$scratch/img/lib/modules/$KREL" --dst "$KDIR/modules/lib/modules/$KREL" \
    -- "${wanted[@]}" || return 1
  # Keep the image package: a later scenario may want more modules.

  log "building sample mdev drivers (${SAMPLE_MODULES[*]})"
  local hdr=$scratch/hdr
  dpkg -x "$KDIR/debs/linux-headers-${KREL}_${KVER}"_*.deb "$hdr"
  dpkg -x "$KDIR/debs/linux-headers-${abi}-common_${KVER}"_*.deb "$hdr"
  dpkg -x "$KDIR/debs/linux-kbuild-${xy}_${KVER}"_*.deb "$hdr"
  # The arch headers' Makefile includes the common one by absolute path, and
  # the scripts/tools symlinks point at /usr/lib/linux-kbuild-X.Y: re-root both.
  sed -i "s|/usr/src/|$hdr/usr/src/|g" "$hdr/usr/src/linux-headers-$KREL/Makefile"
  local l tgt
  while IFS= read -r l; do
    tgt=$(readlink "$l")
    [[ $tgt == /usr/* ]] && ln -sfn "$hdr$tgt" "$l"
  done < <(find "$hdr/usr/src" -type l)
  dpkg -x "$KDIR/debs/linux-source-${xy}_${KVER}"_*.deb "$scratch/src"
  local srcdir=$scratch/mdev
  mkdir -p "$srcdir"
  tar -xf "$scratch/src/usr/src/linux-source-$xy.tar.xz" -C "$srcdir" --strip-components=3 \
    "linux-source-$xy/samples/vfio-mdev" || return 1
  printf 'obj-m += %s.o\n' "${SAMPLE_MODULES[@]}" >"$srcdir/Kbuild"
  make -s -C "$hdr/usr/src/linux-headers-$KREL" M="$srcdir" -j"$(nproc)" modules >&2 || return 1
  mkdir -p "$KDIR/samples"
  local m
  for m in "${SAMPLE_MODULES[@]}"; do cp "$srcdir/$m.ko" "$KDIR/samples/"; done

  # Drop the large downloads; keep the image package (modules on demand).
  rm -f "$KDIR/debs/linux-source-"* "$KDIR/debs/linux-headers-"* "$KDIR/debs/linux-kbuild-"*
  rm -rf "$scratch"
  echo "$KREL $KVER" >"$KDIR/.complete"
}

# Module names (first word) of the base list and all scenario declarations.
all_wanted_module_names() {
  local e
  for e in "${BASE_MODULES[@]}"; do echo "${e%% *}"; done
  cat "$LAB_DIR"/scenarios/*.sh 2>/dev/null | sed -n 's/^# lab-modules:[[:space:]]*//p' | awk '{print $1}'
}

# Make sure the cached module pool has these modules; re-extract from the
# kept image package when a new scenario asks for one we do not have.
ensure_module_pool() {
  local missing
  missing=$(python3 "$LAB_DIR/tools/labtool.py" missing --pool "$KDIR/modules/lib/modules/$KREL" \
    --samples "$KDIR/samples" -- "$@") || die "labtool missing failed"
  [[ -z $missing ]] && return 0
  [[ $LEG == 6.12 ]] && die "the 6.12 lab kernel has no module(s) $missing: add them to lab/kernel/lab-6.12.config"
  log "module pool lacks: $missing; re-extracting from the image package"
  (
    flock 9
    local scratch=$KDIR/scratch-mod deb
    rm -rf "$scratch"
    deb=$(compgen -G "$KDIR/debs/linux-image-${KREL}_${KVER}_*.deb" | head -1)
    if [[ -z $deb ]]; then
      mkdir -p "$KDIR/debs"; (cd "$KDIR/debs" && download_debs "linux-image-$KREL=$KVER")
      deb=$(compgen -G "$KDIR/debs/linux-image-${KREL}_${KVER}_*.deb" | head -1)
    fi
    dpkg -x "$deb" "$scratch"
    depmod -b "$scratch" "$KREL"
    local wanted; mapfile -t wanted < <(all_wanted_module_names)
    python3 "$LAB_DIR/tools/labtool.py" modules --src "$scratch/lib/modules/$KREL" \
      --dst "$KDIR/modules/lib/modules/$KREL" -- "${wanted[@]}" "$@"
    rm -rf "$scratch"
  ) 9>"$KDIR.lock" || die "could not extract modules $missing"
}

# --------------------------------------------------------------------------
# What an L2 VM inside the guest boots (scenarios with "# lab-carry: ovmf" or
# "# lab-carry: kernel", e.g. l2linux)

# OVMF: Debian 12's ovmf package (edk2 2022.11), fetched with the system's apt
# sources as the kernel package is (apt-get download, dpkg -x into the cache;
# never installed).  A complete entry is used without asking apt.
OVMF_FD=''
prepare_ovmf() {
  [[ -n $OVMF_FD ]] && return
  local t0 entry ver dir; t0=$(now)
  entry=$(ls -d "$CACHE_ROOT"/ovmf-*/.complete 2>/dev/null | sort -V | tail -1 || true)
  if [[ -z $entry ]]; then
    ver=$(apt-cache show --no-all-versions ovmf 2>/dev/null | awk '$1 == "Version:" {print $2; exit}')
    [[ -n $ver ]] || die "apt-cache has no ovmf package (Debian 12 main)"
    dir=$CACHE_ROOT/ovmf-${ver//[:~+]/_}
    mkdir -p "$CACHE_ROOT"
    (
      flock 9
      [[ -f $dir/.complete ]] && exit 0
      rm -rf "$dir"; mkdir -p "$dir/debs"
      (cd "$dir/debs" && download_debs "ovmf=$ver") || exit 3
      dpkg -x "$dir"/debs/ovmf_*.deb "$dir/root"
      cp "$dir/root/usr/share/ovmf/OVMF.fd" "$dir/OVMF.fd"
      rm -rf "$dir/debs" "$dir/root"
      echo "ovmf $ver fetched in $(elapsed "$t0") s" >"$dir/.complete"
    ) 9>"$dir.lock" || die "could not fetch Debian's ovmf $ver (apt-get download ovmf=$ver)"
    entry=$dir/.complete
  fi
  OVMF_FD=$(dirname "$entry")/OVMF.fd
  log "ovmf: $(cat "$entry") ($OVMF_FD, $(elapsed "$t0") s)"
}

# The leg's own kernel as a bzImage (x86 boot protocol + EFI stub: boots under
# SeaBIOS and OVMF alike), kept in the kernel's cache entry: on 6.1 the
# vmlinuz of the image package the entry keeps; on 6.12 build.sh's bzImage.
l2_bzimage() {
  local img=$KDIR/bzImage deb
  if [[ $LEG == 6.12 ]]; then
    [[ -f $img ]] || die "the 6.12 cache entry $KDIR has no bzImage (built by lab/kernel/build.sh since its SCHEME 2)"
    echo "$img"; return
  fi
  if [[ ! -f $img ]]; then
    (
      flock 9
      [[ -f $img ]] && exit 0
      deb=$(compgen -G "$KDIR/debs/linux-image-${KREL}_${KVER}_*.deb" | head -1)
      if [[ -z $deb ]]; then
        mkdir -p "$KDIR/debs"; (cd "$KDIR/debs" && download_debs "linux-image-$KREL=$KVER")
        deb=$(compgen -G "$KDIR/debs/linux-image-${KREL}_${KVER}_*.deb" | head -1)
      fi
      dpkg-deb --fsys-tarfile "$deb" | tar -xO "./boot/vmlinuz-$KREL" >"$img.tmp" && mv "$img.tmp" "$img"
    ) 9>"$KDIR.lock" || die "could not take vmlinuz-$KREL out of its image package"
  fi
  echo "$img"
}

# carry_cluster ROOT: the cluster lab (docs/cluster.md). The binaries of lab/cluster/build.sh
# (built here if not cached: ~20 min of CPU cold, an hour on a loaded 2-core machine; a build
# already running, such as .ci/run's background one, is waited for) reach the guest read-only
# over 9p (the entry, ~600 MB: kept out of the initramfs) at /opt/cluster; lab/cluster/prep.sh
# makes a fresh CA, certificates, kubeconfigs and the two image archives into ROOT/lab/cluster.
# The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) runs on the
# host's loopback (lab/cluster/host.sh, state in WORK/cluster-host), started here so that it is
# up while the guest boots; the guest's kubelet reaches it over QEMU's user network (qemu_cmd).
# cluster_host_down stops it after the boot (and the runner's EXIT trap, and host.sh's
# watchdog if the runner is killed).
CLUSTER_DIR= CLUSTER_HOST=
carry_cluster() {
  local entry api
  log "cluster binaries (lab/cluster/build.sh)"
  "$LAB_DIR/cluster/build.sh" >&2 || die "could not build the cluster lab's binaries (lab/cluster/build.sh, above)"
  entry=$("$LAB_DIR/cluster/build.sh" --print-dir)
  CLUSTER_DIR=$entry
  CLUSTER_HOST=$(dirname "$1")/cluster-host
  "$LAB_DIR/cluster/host.sh" ports "$CLUSTER_HOST" || die "could not choose the control plane's loopback ports"
  api=$(awk '$1 == "api" { print $2 }' "$CLUSTER_HOST/ports")
  CL_SERVER=https://10.0.2.2:$api CL_EXTRA_NODES=$([[ $NODES == 2 ]] && echo lab2) \
    "$LAB_DIR/cluster/prep.sh" "$entry/bin" "$1/lab/cluster" ||
    die "could not prepare the cluster lab's certificates and images (lab/cluster/prep.sh)"
  cp "$CLUSTER_HOST/ports" "$1/lab/cluster/host-ports"
  log "cluster control plane on the host's loopback (API server 127.0.0.1:$api, the guest's 10.0.2.2:$api)"
  "$LAB_DIR/cluster/host.sh" up "$entry/bin" "$1/lab/cluster" "$CLUSTER_HOST" $$ ||
    die "could not start the cluster's control plane (lab/cluster/host.sh)"
}
# cluster_host_down: the host's control plane stopped (its logs kept in CLUSTER_HOST/log);
# writes CLUSTER_HOST/down.txt, "PASS ..." or "FAIL ...".
cluster_host_down() {
  [[ -n $CLUSTER_HOST && -d $CLUSTER_HOST/run && ! -f $CLUSTER_HOST/down.txt ]] || return 0
  local msg
  if msg=$("$LAB_DIR/cluster/host.sh" down "$CLUSTER_HOST" 2>&1); then
    echo "PASS ${msg//$'\n'/; }" >"$CLUSTER_HOST/down.txt"
  else
    echo "FAIL ${msg//$'\n'/; }" >"$CLUSTER_HOST/down.txt"
  fi
}

# carry_deploy WORK: what `clusterhelm` installs (docs/deploy.md, "In the cluster lab"), in
# WORK/deploy, shared read-only with the guest over virtio-9p at /opt/deploy (mount tag
# "deploy"): helm (deploy/tools/build-helm.sh, built once and cached), the chart
# (deploy/helm/gpupass as committed), and two images of this boot's gpupass made by
# deploy/image/build.sh --binary: gpupass.dev/gpupass:lab-1 and :lab-2, the second packaged
# with SOURCE_DATE_EPOCH one second later (another config and layer time stamp: another
# digest, as a rebuild from a later commit gives), for the upgrade. images.txt: "TAG DIGEST
# FILE" as build.sh printed them, which the guest compares with what containerd imported.
DEPLOY_DIR=''
carry_deploy() {
  local helm_dir epoch n line w1 ref w3 digest
  [[ -n $GPUPASS_BIN ]] || die "lab-carry deploy packages the lab's gpupass into an image: $GPUPASS_WHY"
  DEPLOY_DIR=$1/deploy
  mkdir -p "$DEPLOY_DIR"
  log "helm (deploy/tools/build-helm.sh)"
  "$REPO/deploy/tools/build-helm.sh" >&2 || die "could not build helm (deploy/tools/build-helm.sh, above)"
  helm_dir=$("$REPO/deploy/tools/build-helm.sh" --print-dir)
  cp "$helm_dir/bin/helm" "$DEPLOY_DIR/helm"
  cp -r "$REPO/deploy/helm/gpupass" "$DEPLOY_DIR/chart"
  epoch=$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || date +%s)
  : >"$DEPLOY_DIR/images.txt"
  for n in 1 2; do
    line=$(SOURCE_DATE_EPOCH=$((epoch + n - 1)) "$REPO/deploy/image/build.sh" --binary "$GPUPASS_BIN" \
      --tag "gpupass.dev/gpupass:lab-$n" --out "$DEPLOY_DIR/gpupass-lab-$n.oci.tar" | tail -1) ||
      die "deploy/image/build.sh --binary $GPUPASS_BIN failed"
    # "image REF digest sha256:... size BYTES file FILE"
    read -r w1 ref w3 digest _ <<<"$line"
    [[ $w1 == image && $w3 == digest && $digest == sha256:* ]] ||
      die "deploy/image/build.sh printed '$line', not 'image REF digest sha256:...'"
    echo "$ref $digest gpupass-lab-$n.oci.tar" >>"$DEPLOY_DIR/images.txt"
  done
  log "deploy: helm $("$DEPLOY_DIR/helm" version --short 2>/dev/null), images $(awk '{ printf "%s %s; ", $1, $2 }' "$DEPLOY_DIR/images.txt")"
}

# carry_libvirt WORK: WORK/libvirt, shared read-write with the guest, and
# lab/tools/libvirtnative.py serving it for this boot: the guest writes NAME.xml and NAME.req,
# the host answers with `virsh -c qemu:///session domxml-to-native` of it (Debian 12's libvirt
# 9.0, as user nobody, emulator = the lab's QEMU 10.0), made runnable in L1 (NAME.argv, what
# was changed in NAME.adjust). Nothing is defined or started on the host; no host device is
# touched. libvirt_down stops it after the boot.
LIBVIRT_DIR='' LIBVIRT_PID=''
carry_libvirt() {
  local t
  for t in virsh runuser python3 /usr/sbin/libvirtd; do
    command -v "$t" >/dev/null || [[ -x $t ]] ||
      die "lab-carry libvirt needs $t on the host (tests/install-deps.sh installs libvirt-clients, libvirt-daemon-driver-qemu and ovmf)"
  done
  getent group kvm >/dev/null || die "lab-carry libvirt runs virsh as nobody:kvm; there is no group kvm (install qemu-system-x86 or add it)"
  compgen -G "/usr/share/qemu/firmware/*edk2-x86_64*.json" >/dev/null ||
    die "lab-carry libvirt: no OVMF firmware descriptor in /usr/share/qemu/firmware (apt-get install ovmf)"
  LIBVIRT_DIR=$1/libvirt
  mkdir -p "$LIBVIRT_DIR"
  python3 "$LAB_DIR/tools/libvirtnative.py" serve "$LIBVIRT_DIR" "$(dirname "$(dirname "$QEMU_BIN")")" $$ \
    >"$1/libvirt-serve.log" 2>&1 &
  LIBVIRT_PID=$!
  log "libvirt: domxml-to-native for the guest at /lab/libvirt ($(virsh --version), pid $LIBVIRT_PID)"
}
libvirt_down() {
  [[ -n $LIBVIRT_PID ]] || return 0
  kill "$LIBVIRT_PID" 2>/dev/null || true
  wait "$LIBVIRT_PID" 2>/dev/null || true
  LIBVIRT_PID=''
}

# carry_l2_kernel ROOT: /lab/l2/bzImage (the leg's kernel), /lab/l2/initrd.gz (static
# busybox + lab/guest/l2init), /lab/l2/lib.sh (lab/guest/l2lib.sh, the scenarios' helpers)
# and /lab/l2/pciutils (lspci for L1) in the initramfs tree ROOT.
carry_l2_kernel() {
  local root=$1 l2
  l2=$(dirname "$root")/l2root
  mkdir -p "$root/lab/l2"
  cp "$(l2_bzimage)" "$root/lab/l2/bzImage"
  cp "$LAB_DIR/guest/l2lib.sh" "$root/lab/l2/lib.sh"
  # pciutils' lspci for L1 (dynamic: the binary, the libraries ldd names and the loader, in
  # one directory; run through the loader), which decodes the config space the L2 kernel
  # printed (`lspci -F`). Not in the L2 initrd: its libraries (libcrypto through libkmod)
  # would make that 4.6 MB instead of 1.0 MB, for an L2 boot that is slow enough already.
  local lib
  mkdir -p "$root/lab/l2/pciutils"
  cp "$(command -v lspci)" "$root/lab/l2/pciutils/lspci"
  for lib in $(ldd "$(command -v lspci)" | grep -o '/[^ ]*'); do
    cp -L "$lib" "$root/lab/l2/pciutils/"
  done
  rm -rf "$l2"; mkdir -p "$l2"/{bin,proc,sys,dev}
  cp /bin/busybox "$l2/bin/busybox"
  cp "$LAB_DIR/guest/l2init" "$l2/init"
  chmod 755 "$l2/init"
  (cd "$l2" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) |
    gzip -9 >"$root/lab/l2/initrd.gz"
}

# --------------------------------------------------------------------------
# gpupass static binary

GPUPASS_BIN=''
GPUPASS_WHY=''
WORK=''
build_gpupass() {
  if [[ -n ${GPUPASS_LAB_BIN:-} ]]; then
    [[ -x $GPUPASS_LAB_BIN ]] || die "GPUPASS_LAB_BIN=$GPUPASS_LAB_BIN is not executable"
    GPUPASS_BIN=$GPUPASS_LAB_BIN
    return
  fi
  if [[ ! -f $REPO/Cargo.toml ]]; then
    GPUPASS_WHY="no Cargo.toml in $REPO (the crate has not landed yet)"
    return
  fi
  command -v cargo >/dev/null || { GPUPASS_WHY="cargo not found"; return; }
  # [profile.lab] in Cargo.toml: release at opt-level 1, no LTO, incremental. Against
  # --release a fresh build takes ~0.7x the time (2 idle cores: 172 -> 119 s) and a rebuild
  # after an edit seconds instead of minutes; gpupass then runs ~30 % more instructions per
  # command (docs/lab.md, "Costs measured"). GPUPASS_LAB_PROFILE=release builds the optimized
  # binary contrib/install.sh installs (for benchmarks).
  local profile=${GPUPASS_LAB_PROFILE:-lab} dir
  case $profile in dev) dir=debug ;; *) dir=$profile ;; esac
  local bin=$REPO/target/lab/$TARGET_TRIPLE/$dir/gpupass
  # --features dra: `gpupass dra-plugin` for clusterdra (kube-rs, k8s-openapi: ~1.5 min more of
  # a first build). --features testkit: the crash scenarios (bind.sh: GPUPASS_FAIL_WRITE,
  # GPUPASS_CRASH_AFTER_WRITE) need the failpoints, which a release build leaves out.
  local cargo=(cargo build --profile "$profile" --target "$TARGET_TRIPLE" --target-dir target/lab --bin gpupass --features testkit,dra)
  local rustflags="${RUSTFLAGS:+$RUSTFLAGS }-C target-feature=+crt-static -C relocation-model=static"
  local t0 s0=$SECONDS ok=0; t0=$(now)
  if [[ -x $bin ]]; then
    log "building static gpupass (${cargo[*]})"
  else
    log "building static gpupass for the first time: ~150 crates, 2-2.5 min on 2 cores; later runs rebuild only what changed, in seconds (${cargo[*]})"
  fi
  if [[ -t 2 ]]; then
    # A terminal: cargo draws its progress bar (crates done / total, what is compiling).
    (cd "$REPO" && RUSTFLAGS=$rustflags "${cargo[@]}" >&2) && ok=1
  else
    # No terminal (a log, cargo test): cargo prints a "Compiling" line per crate and no bar;
    # number them and add the seconds so far.
    if (cd "$REPO" && RUSTFLAGS=$rustflags "${cargo[@]}" 2>&1) | {
      n=0
      while IFS= read -r line; do
        [[ $line == *' Compiling '* ]] && line+="  [$((++n)), $((SECONDS - s0)) s]"
        printf '%s\n' "$line"
      done
    } >&2; then ok=1; fi
  fi
  if ((ok)); then
    GPUPASS_BIN=$bin
    log "gpupass built in $(elapsed "$t0") s"
  else
    GPUPASS_WHY="cargo build of the static gpupass failed (see above)"
  fi
}

# --------------------------------------------------------------------------
# scenarios

# The judges of judged scenarios (lab/judge: tests/it/labjudge as a program), built on the
# host into target/lab/judge: a package of its own with serde_json only, so it builds in
# seconds and never waits on the target directory of a `cargo test` that runs the lab.
JUDGE_BIN='' JUDGE_WHY=''
build_judge() {
  [[ -n $JUDGE_BIN || -n $JUDGE_WHY ]] && return
  if [[ -n ${GPUPASS_LAB_JUDGE:-} ]]; then
    [[ -x $GPUPASS_LAB_JUDGE ]] || die "GPUPASS_LAB_JUDGE=$GPUPASS_LAB_JUDGE is not executable"
    JUDGE_BIN=$GPUPASS_LAB_JUDGE
    return
  fi
  command -v cargo >/dev/null || { JUDGE_WHY="cargo not found"; return; }
  local out t0; t0=$(now)
  if out=$(cd "$REPO" && cargo build --quiet --manifest-path lab/judge/Cargo.toml --target-dir target/lab/judge 2>&1); then
    JUDGE_BIN=$REPO/target/lab/judge/debug/labjudge
    log "judge: $JUDGE_BIN ($(elapsed "$t0") s)"
  else
    JUDGE_WHY="cargo build --manifest-path lab/judge/Cargo.toml failed: $(tail -5 <<<"$out" | tr '\n' ' ')"
  fi
}

scenario_file() { echo "$LAB_DIR/scenarios/$1.sh"; }
# scenario_decl NAME KEY: values of "# lab-KEY: value" header lines
scenario_decl() { sed -n "s/^# lab-$2:[[:space:]]*//p" "$(scenario_file "$1")"; }

list_scenarios() {
  local f n
  for f in "$LAB_DIR"/scenarios/*.sh; do
    n=$(basename "$f" .sh)
    printf '%-12s %s\n' "$n" "$(scenario_decl "$n" about | head -1)"
  done
}

# --------------------------------------------------------------------------
# initramfs

build_initramfs() { # WORK SCENARIOS...
  local work=$1; shift
  local root=$work/root mods=() m
  rm -rf "$root"; mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,lab/scenarios,lib/modules}
  cp /bin/busybox "$root/bin/busybox"
  cp "$LAB_DIR/guest/init" "$root/init"
  cp "$LAB_DIR/guest/lib.sh" "$root/lab/lib.sh"
  chmod 755 "$root/init"

  # modules.list: base order, then scenario extras (deduplicated by name).
  : >"$root/lab/modules.list"
  local seen=" " name
  for m in "${BASE_MODULES[@]}"; do
    name=${m%% *}; seen+="$name "; echo "$m" >>"$root/lab/modules.list"; mods+=("$name")
  done
  local s
  for s in "$@"; do
    while IFS= read -r m; do
      [[ -n $m ]] || continue
      name=${m%% *}
      [[ $seen == *" $name "* ]] && continue
      seen+="$name "; echo "$m" >>"$root/lab/modules.list"; mods+=("$name")
    done < <(scenario_decl "$s" modules)
    cp "$(scenario_file "$s")" "$root/lab/scenarios/$s.sh"
    # "# lab-carry: qemu": the lab's QEMU 10.0 with its libraries and firmware
    # at /opt/qemu/bin/qemu-system-x86_64 in the guest (nested VMs).
    if scenario_decl "$s" carry | grep -qw qemu && [[ ! -d $root/opt/qemu ]]; then
      "$LAB_DIR/tools/qemu.sh" carry "$CACHE_ROOT" "$root" || die "could not carry QEMU into the guest"
    fi
    # "# lab-carry: ovmf": Debian 12's OVMF.fd at /opt/ovmf/OVMF.fd (UEFI L2 guests).
    if scenario_decl "$s" carry | grep -qw ovmf && [[ ! -f $root/opt/ovmf/OVMF.fd ]]; then
      prepare_ovmf
      mkdir -p "$root/opt/ovmf" && cp "$OVMF_FD" "$root/opt/ovmf/OVMF.fd"
    fi
    # "# lab-carry: kernel": the leg's kernel and a busybox initrd for an L2 Linux
    # (/lab/l2/bzImage, /lab/l2/initrd.gz; lab/guest/l2init, lab/guest/l2lib.sh).
    if scenario_decl "$s" carry | grep -qw kernel && [[ ! -f $root/lab/l2/bzImage ]]; then
      carry_l2_kernel "$root"
    fi
    # "# lab-carry: cluster": Kubernetes, containerd, runc, etcd, CNI (docs/cluster.md) at
    # /opt/cluster (bin/, versions) over 9p (mount tag "cluster"), certificates and images in
    # /lab/cluster.
    if scenario_decl "$s" carry | grep -qw cluster && [[ -z $CLUSTER_DIR ]]; then
      carry_cluster "$root"
    fi
    # "# lab-carry: deploy": helm, the chart and two images of gpupass at /opt/deploy over 9p
    # (mount tag "deploy"; carry_deploy).
    if scenario_decl "$s" carry | grep -qw deploy && [[ -z $DEPLOY_DIR ]]; then
      carry_deploy "$(dirname "$root")"
    fi
    # "# lab-carry: libvirt": libvirt's QEMU driver on the host turns domain XML that the guest
    # writes into QEMU command lines, over virtio-9p at /lab/libvirt (read-write, mount tag
    # "libvirt"; lab/tools/libvirtnative.py).
    if scenario_decl "$s" carry | grep -qw libvirt && [[ -z $LIBVIRT_DIR ]]; then
      carry_libvirt "$(dirname "$root")"
    fi
    # "# lab-files: /usr/bin/x": host binaries a scenario runs in the guest, with their libraries.
    local f lib
    for f in $(scenario_decl "$s" files); do
      [[ -f $f ]] || die "scenario $s needs $f on the host (lab-files; install its Debian package)"
      cp -L --parents "$f" "$root"
      for lib in $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*'); do
        [[ -e $root$lib ]] || cp -L --parents "$lib" "$root"
      done
    done
  done
  ensure_module_pool "${mods[@]}"
  python3 "$LAB_DIR/tools/labtool.py" closure --pool "$KDIR/modules/lib/modules/$KREL" \
    --samples "$KDIR/samples" --dst "$root/lib/modules/$KREL" -- "${mods[@]}" ||
    die "could not assemble modules"
  depmod -b "$root" "$KREL" 2>/dev/null || die "depmod failed"

  if [[ -n $GPUPASS_BIN ]]; then
    cp "$GPUPASS_BIN" "$root/bin/gpupass"
  fi
  {
    echo "LAB_SCENARIOS='$*'"
    echo "LAB_KREL='$KREL'"
    echo "LAB_HAVE_GPUPASS=$([[ -n $GPUPASS_BIN ]] && echo 1 || echo 0)"
    echo "LAB_KERNEL=$LEG"
    # 6.12: the unified hierarchy only, as current distributions boot;
    # 6.1: cgroup v1 with the devices controller (the legacy container path), unless a
    # scenario of the boot declares "# lab-cgroup: v2" (the cluster lab: kubelet 1.37 refuses
    # cgroup v1), as Debian 12 itself boots 6.1 (systemd's unified hierarchy).
    local cg=v1
    [[ $LEG == 6.12 ]] && cg=v2
    for s in "$@"; do
      scenario_decl "$s" cgroup | grep -qx v2 && cg=v2
    done
    echo "LAB_CGROUP=$cg"
  } >"$root/lab/config"
  (cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) |
    gzip -1 >"$work/initramfs.cpio.gz"
}

# --------------------------------------------------------------------------
# boot

qemu_cmd() { # WORK EXTRA_APPEND SCENARIOS...
  local work=$1 append=$2; shift 2
  local s line
  # "# lab-append: words": kernel command-line words a scenario needs.
  for s in "$@"; do
    while IFS= read -r line; do append+=" $line"; done < <(scenario_decl "$s" append)
  done
  # "# lab-mem: MiB", "# lab-smp: N": guest RAM and vCPUs, the most any scenario of the boot
  # asks for (default 1024 MiB, 1 vCPU; more vCPUs are more TCG threads on the host).
  local mem=1024 smp=1 m
  for s in "$@"; do
    m=$(scenario_decl "$s" mem | head -1)
    [[ -z $m ]] || ((m <= mem)) || mem=$m
    m=$(scenario_decl "$s" smp | head -1)
    [[ -z $m ]] || ((m <= smp)) || smp=$m
  done
  # The big-BAR device's memory: a sparse file (no disk blocks until written).
  local bigbar=$work/${QEMU_BIGBAR:-bigbar.img}
  truncate -s 16G "$bigbar"
  # shellcheck disable=SC2054  # commas are QEMU's option syntax
  QEMU=("$QEMU_BIN" -accel tcg -M q35,kernel-irqchip=split -cpu max -m "$mem" -smp "$smp"
    -nodefaults -display none -no-reboot
    -kernel "$KDIR/vmlinux" -initrd "$work/initramfs.cpio.gz"
    -append "console=ttyS0 panic=-1 quiet no_timer_check intel_iommu=on iommu=pt $append"
    -device intel-iommu,intremap=on,caching-mode=on
    -device VGA,bus=pcie.0,addr=0x2
    -device bochs-display,bus=pcie.0,addr=0x3
    -device virtio-gpu-pci,bus=pcie.0,addr=0x4
    -device VGA,bus=pcie.0,addr=0x5.0x0,multifunction=on
    -audiodev none,id=snd0 -device ich9-intel-hda,bus=pcie.0,addr=0x5.0x1,id=hda
    -device hda-duplex,bus=hda.0,audiodev=snd0
    -device edu,bus=pcie.0,addr=0x6
    -device pci-testdev,bus=pcie.0,addr=0x7
    -device pcie-root-port,id=rp1,bus=pcie.0,addr=0x8,chassis=1
    -device bochs-display,bus=rp1
    # A 16 GiB 64-bit prefetchable BAR (ivshmem-plain BAR2), the stand-in for an
    # H100/H200 BAR1; the firmware places it above 4 GiB.
    -object memory-backend-file,id=lab-bigbar,mem-path="$bigbar",size=16G,share=on
    -device ivshmem-plain,memdev=lab-bigbar,bus=pcie.0,addr=0xc
    # MSI-X (5 vectors), MSI and INTx without a vendor driver: e1000e's ICS register
    # raises an interrupt cause on demand (docs/lab.md).  No netdev: a NIC with no peer.
    -device e1000e,bus=pcie.0,addr=0xd,mac=52:54:00:12:34:56)
  # "# lab-carry: cluster": the cluster build's entry (bin/, versions) read-only over virtio-9p
  # at 00:0e.0, and two virtio-net NICs without a peer (no network behind them: nothing leaves
  # the guest), 00:11.0 the node's address, 00:12.0 the one the CNI host-device plugin moves
  # into a pod. Only in such a boot; the device map of the others is unchanged.
  # The node's NIC (00:11.0) is on QEMU's user network: the guest is 10.0.2.15, and its
  # connections to 10.0.2.2:PORT become the host's 127.0.0.1:PORT, where lab/cluster/host.sh's
  # API server listens; no port of the guest is forwarded, no DHCP or DNS is used.
  if [[ -n $CLUSTER_DIR ]]; then
    # shellcheck disable=SC2054
    QEMU+=(-fsdev "local,id=clusterfs,path=$CLUSTER_DIR,security_model=none,readonly=on"
      -device virtio-9p-pci,fsdev=clusterfs,mount_tag=cluster,bus=pcie.0,addr=0xe
      -netdev user,id=clnode,net=10.0.2.0/24,host=10.0.2.2,ipv6=off
      -device virtio-net-pci,netdev=clnode,bus=pcie.0,addr=0x11,mac=52:54:00:c1:00:01
      -device virtio-net-pci,bus=pcie.0,addr=0x12,mac=52:54:00:c1:00:02)
  fi
  # "# lab-carry: deploy": helm, the chart and the images, read-only over virtio-9p at 00:13.0.
  if [[ -n $DEPLOY_DIR ]]; then
    # shellcheck disable=SC2054
    QEMU+=(-fsdev "local,id=deployfs,path=$DEPLOY_DIR,security_model=none,readonly=on"
      -device virtio-9p-pci,fsdev=deployfs,mount_tag=deploy,bus=pcie.0,addr=0x13)
  fi
  # "# lab-carry: libvirt": the host's libvirt conversions, read-write over virtio-9p at 00:10.0.
  if [[ -n $LIBVIRT_DIR ]]; then
    # shellcheck disable=SC2054
    QEMU+=(-fsdev "local,id=libvirtfs,path=$LIBVIRT_DIR,security_model=none"
      -device virtio-9p-pci,fsdev=libvirtfs,mount_tag=libvirt,bus=pcie.0,addr=0x10)
  fi
  # "# lab-qemu: args": devices a scenario adds. A line two scenarios of the boot both declare
  # (l2huge's and l2libvirt's 64 GiB ivshmem at 00:0f.0) is added once.
  local seen=$'\n'
  for s in "$@"; do
    while IFS= read -r line; do
      [[ -n $line ]] || continue
      [[ $seen == *$'\n'"$line"$'\n'* ]] && continue
      seen+="$line"$'\n'
      # shellcheck disable=SC2206  # word splitting of declared args is intended
      QEMU+=($line)
    done < <(scenario_decl "$s" qemu)
  done
}

# A two-node boot ("# lab-nodes: 2", docs/cluster.md "Two nodes"): a second guest, booted beside
# the first from the same kernel and initramfs, with a QEMU of its own and so a user network of
# its own (the host's control plane is 10.0.2.2 to both). Its kernel command line names its node
# (lab.node=lab2, lab.nodeip=10.0.2.16, lab.podnet=10.88.2.0/24: lab/cluster/guest.sh), its
# big-BAR file is its own, and the scenarios' "# lab-qemu-node2:" lines add the devices only it
# has. Its console and data channel are files; after the boot its results join each scenario's
# directory with the prefix "node2." (node2.guest.json, node2.console.log, node2.NAME for each
# file it shipped).
NODES=1 NODE2_PID='' QEMU2=()
node2_cmd() { # WORK SCENARIOS...
  local work=$1; shift
  local s line
  QEMU_BIGBAR=bigbar2.img qemu_cmd "$work" "lab.node=lab2 lab.nodeip=10.0.2.16 lab.podnet=10.88.2.0/24" "$@"
  for s in "$@"; do
    while IFS= read -r line; do
      # shellcheck disable=SC2206  # word splitting of declared args is intended
      [[ -n $line ]] && QEMU+=($line)
    done < <(scenario_decl "$s" qemu-node2)
  done
  QEMU2=("${QEMU[@]}" -serial "file:$work/node2-console.log" -serial "file:$work/node2-data.log")
  echo "${QEMU2[*]}" >"$work/node2-qemu.cmdline"
}
node2_down() {
  [[ -n $NODE2_PID ]] || return 0
  kill "$NODE2_PID" 2>/dev/null || true
  wait "$NODE2_PID" 2>/dev/null || true
  NODE2_PID=''
}
node2_collect() { # WORK SCENARIOS...
  local work=$1 a f; shift
  touch "$work/node2-data.log" "$work/node2-console.log"
  python3 "$LAB_DIR/tools/labtool.py" collect --data "$work/node2-data.log" --out "$work/node2-out" -- "$@" ||
    log "collect (the second guest) reported problems"
  for a in "$@"; do
    for f in "$work/node2-out/$a"/*; do
      [[ -f $f ]] && cp "$f" "$OUT_ROOT/$a/node2.$(basename "$f")"
    done
    cp "$work/node2-console.log" "$OUT_ROOT/$a/node2.console.log"
    cp "$work/node2-data.log" "$OUT_ROOT/$a/node2.channel.log"
    cp "$work/node2-qemu.cmdline" "$OUT_ROOT/$a/node2.qemu.cmdline"
    cp "$work/node2-qemu.rc" "$OUT_ROOT/$a/node2.qemu.rc" 2>/dev/null || true
    tail -n 50 "$work/node2-qemu.log" >"$OUT_ROOT/$a/node2.qemu.log" 2>/dev/null || true
  done
}

boot_timeout() {
  local t=$BASE_TIMEOUT s x
  for s in "$@"; do
    x=$(scenario_decl "$s" timeout | head -1)
    [[ -n $x ]] && t=$((t + x))
  done
  echo "$t"
}

cmd_run() { # [--update-fixture] SCENARIOS...
  local scen=() a
  for a in "$@"; do
    case $a in
      --update-fixture) export GPUPASS_LAB_UPDATE_FIXTURE=1 ;;
      -*) die "unknown option $a" ;;
      *) [[ -f $(scenario_file "$a") ]] || die "no scenario '$a' (have: $(list_scenarios | awk '{printf "%s ", $1}'))"
        scen+=("$a") ;;
    esac
  done
  ((${#scen[@]})) || die "usage: lab/lab.sh run SCENARIO [SCENARIO...]"
  local t0; t0=$(now)
  # Clear old results first, so nothing stale survives a failed preparation.
  for a in "${scen[@]}"; do rm -rf "${OUT_ROOT:?}/$a"; mkdir -p "$OUT_ROOT/$a"; done
  ensure_packages
  prepare_qemu
  prepare_kernel
  build_gpupass
  for a in "${scen[@]}"; do
    if scenario_decl "$a" needs | grep -qw gpupass && [[ -z $GPUPASS_BIN ]]; then
      die "scenario '$a' needs the gpupass binary: $GPUPASS_WHY"
    fi
  done
  for a in "${scen[@]}"; do
    if scenario_decl "$a" judge | grep -qx rust; then
      build_judge
      [[ -n $JUDGE_BIN ]] || die "scenario '$a' is judged in Rust and the judge did not build: $JUDGE_WHY"
    fi
  done

  # "# lab-nodes: 2": two guests at once (a two-node cluster, docs/cluster.md "Two nodes").
  for a in "${scen[@]}"; do
    case $(scenario_decl "$a" nodes | head -1) in
      '' | 1) ;;
      2) NODES=2 ;;
      *) die "scenario $a: '# lab-nodes:' takes 1 or 2" ;;
    esac
  done
  if [[ $NODES == 2 ]]; then
    for a in "${scen[@]}"; do
      [[ $(scenario_decl "$a" nodes | head -1) == 2 ]] ||
        die "scenario $a runs on one guest and ${scen[*]} asks for two: run the two-node scenarios in a boot of their own"
    done
  fi

  mkdir -p "$REPO/target/lab/work" "$OUT_ROOT"
  WORK=$(mktemp -d "$REPO/target/lab/work/run.XXXXXX")
  trap 'node2_down; cluster_host_down; libvirt_down; rm -rf "$WORK"' EXIT
  local work=$WORK
  build_initramfs "$work" "${scen[@]}"
  log "initramfs $(du -h "$work/initramfs.cpio.gz" | cut -f1), prepared in $(elapsed "$t0") s"

  local tmo rc
  tmo=$(boot_timeout "${scen[@]}")
  if [[ $NODES == 2 ]]; then
    node2_cmd "$work" "${scen[@]}"
  fi
  qemu_cmd "$work" "" "${scen[@]}"
  local data=$work/data.log console=$work/console.log
  QEMU+=(-serial stdio -serial "file:$data")
  echo "${QEMU[*]}" >"$work/qemu.cmdline"
  log "booting (${scen[*]}), limit ${tmo} s"
  # A boot that runs out of time leaves a snapshot of L1's vCPU and interrupt controllers,
  # taken through QEMU's human monitor 10 s before the limit (hang-monitor.txt in each
  # scenario's directory): where a stuck guest was, halted or not, with which timer armed.
  QEMU+=(-monitor "unix:$work/monitor.sock,server=on,wait=off")
  # Its sleep is killed with it (the TERM trap): a sleep left behind would keep every
  # descriptor the runner inherited open for the boot's whole limit (a caller's lock, a pipe).
  (
    trap 'kill "$sp" 2>/dev/null; exit 0' TERM
    sleep $((tmo > 20 ? tmo - 10 : tmo)) &
    sp=$!
    wait "$sp" &&
      python3 "$LAB_DIR/tools/labtool.py" monitor --socket "$work/monitor.sock" -- \
        'info registers' 'info lapic' 'info pic' 'info irq' >"$work/hang-monitor.txt" 2>&1
  ) </dev/null >/dev/null 2>&1 &
  local snap=$!
  local tb; tb=$(now)
  if [[ $NODES == 2 ]]; then
    log "booting the second guest (node lab2) beside it"
    timeout -k 5 "$tmo" "${QEMU2[@]}" </dev/null >"$work/node2-qemu.log" 2>&1 &
    NODE2_PID=$!
  fi
  set +e
  if [[ -n ${GPUPASS_LAB_QUIET:-} ]]; then
    timeout -k 5 "$tmo" "${QEMU[@]}" </dev/null >"$console" 2>&1
    rc=$?
  else
    timeout -k 5 "$tmo" "${QEMU[@]}" </dev/null 2>&1 | tee "$console"
    rc=${PIPESTATUS[0]}
  fi
  kill "$snap" 2>/dev/null
  set -e
  local boot_s; boot_s=$(elapsed "$tb")
  if [[ $NODES == 2 ]]; then
    local rc2=0
    wait "$NODE2_PID" || rc2=$?
    echo "$rc2" >"$work/node2-qemu.rc"
    NODE2_PID=''
    log "both guests ended: $(elapsed "$tb") s (the first after $boot_s s, QEMU exit $rc; the second's QEMU exit $(cat "$work/node2-qemu.rc"))"
    boot_s=$(elapsed "$tb")
  fi
  touch "$data"
  for a in "${scen[@]}"; do
    cp "$console" "$OUT_ROOT/$a/console.log"
    cp "$data" "$OUT_ROOT/$a/channel.log"
    cp "$work/qemu.cmdline" "$OUT_ROOT/$a/qemu.cmdline"
    if [[ -s $work/hang-monitor.txt ]]; then cp "$work/hang-monitor.txt" "$OUT_ROOT/$a/"; fi
  done
  if [[ -s $work/hang-monitor.txt ]]; then log "out of time: L1's state 10 s before the limit in hang-monitor.txt"; fi
  # The host's libvirt service: stopped now, its log beside each scenario that used it.
  if [[ -n $LIBVIRT_DIR ]]; then
    libvirt_down
    for a in "${scen[@]}"; do
      scenario_decl "$a" carry | grep -qw libvirt || continue
      mkdir -p "$OUT_ROOT/$a/host"
      cp "$work/libvirt-serve.log" "$OUT_ROOT/$a/host/" 2>/dev/null || true
    done
  fi
  # The cluster's control plane on the host: stopped now, its logs and verdict beside each
  # cluster scenario's results (read by lab/scenarios/cluster*.check).
  if [[ -n $CLUSTER_HOST ]]; then
    cluster_host_down
    for a in "${scen[@]}"; do
      scenario_decl "$a" carry | grep -qw cluster || continue
      mkdir -p "$OUT_ROOT/$a/host"
      cp "$CLUSTER_HOST/down.txt" "$CLUSTER_HOST/ports" "$OUT_ROOT/$a/host/" 2>/dev/null || true
      for f in "$CLUSTER_HOST"/log/*.log; do
        [[ -f $f ]] && tail -n 3000 "$f" >"$OUT_ROOT/$a/host/$(basename "$f")"
      done
    done
  fi
  python3 "$LAB_DIR/tools/labtool.py" collect --data "$data" --out "$OUT_ROOT" -- "${scen[@]}" ||
    log "collect reported problems"
  if [[ $NODES == 2 ]]; then node2_collect "$work" "${scen[@]}"; fi

  # Host-side checks: lab/scenarios/NAME.check, run with the scenario's
  # output dir; their LAB-RESULT lines join the report.
  for a in "${scen[@]}"; do
    local chk=$LAB_DIR/scenarios/$a.check
    [[ -f $chk ]] || continue
    # Only for scenarios that ran to their end; the report already fails the rest.
    grep -qa "^LAB-END $a " "$data" || continue
    log "host check $a"
    set +e
    LAB_SCENARIO=$a LAB_OUT=$OUT_ROOT/$a LAB_REPO=$REPO LAB_GPUPASS=$GPUPASS_BIN \
      "$chk" >"$OUT_ROOT/$a/host-check.log" 2>&1
    local crc=$?
    set -e
    cat "$OUT_ROOT/$a/host-check.log" >&2
    if ((crc != 0)); then
      echo "LAB-RESULT $a host-check FAIL $(basename "$chk") exited $crc" >>"$OUT_ROOT/$a/host-check.log"
    fi
  done

  # Judged scenarios ("# lab-judge: rust", docs/lab.md "Judged scenarios"): the Rust judge
  # (lab/judge, the judges of tests/it/labjudge) decides their steps from what the guest
  # shipped, whether or not the scenario reached its end (a missing file fails its steps); its
  # LAB-STEPS and LAB-RESULT lines (judge.log) are the report's steps for the scenario.
  for a in "${scen[@]}"; do
    scenario_decl "$a" judge | grep -qx rust || continue
    log "judge $a"
    set +e
    "$JUDGE_BIN" judge "$a" "$OUT_ROOT/$a" >"$OUT_ROOT/$a/judge.log" 2>"$OUT_ROOT/$a/judge.err"
    local jrc=$?
    set -e
    if ((jrc > 1)); then log "the judge of $a exited $jrc: $(tail -3 "$OUT_ROOT/$a/judge.err")"; fi
  done

  local verdict=0
  python3 "$LAB_DIR/tools/labtool.py" report --out "$OUT_ROOT" --qemu-rc "$rc" --timeout "$tmo" \
    --boot-seconds "$boot_s" --total-seconds "$(elapsed "$t0")" -- "${scen[@]}" || verdict=$?
  return "$verdict"
}

cmd_shell() {
  ensure_packages
  prepare_qemu
  prepare_kernel
  build_gpupass
  mkdir -p "$REPO/target/lab/work"
  WORK=$(mktemp -d "$REPO/target/lab/work/shell.XXXXXX")
  trap 'rm -rf "$WORK"' EXIT
  local work=$WORK
  build_initramfs "$work"
  qemu_cmd "$work" "lab.shell=1"
  QEMU+=(-serial mon:stdio -serial null)
  log "interactive guest shell; 'poweroff -f' or Ctrl-A x to leave"
  "${QEMU[@]}"
}

cmd_prepare() {
  ensure_packages
  prepare_qemu
  prepare_kernel
  build_gpupass
  if [[ -n $GPUPASS_BIN ]]; then log "gpupass: $GPUPASS_BIN"; else log "gpupass: not available: $GPUPASS_WHY"; fi
  log "cache: $KDIR ($(du -sh "$KDIR" | cut -f1))"
}

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit "${1:-0}"
}

case ${1:-} in
  run) shift; cmd_run "$@" ;;
  demo) shift; cmd_run demo "$@" ;;
  prepare) cmd_prepare ;;
  shell) cmd_shell ;;
  list) list_scenarios ;;
  -h | --help | help) usage 0 ;;
  *) usage 2 >&2 ;;
esac
