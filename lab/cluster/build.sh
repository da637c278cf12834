#!/usr/bin/env bash
# Builds the cluster lab's binaries (docs/cluster.md) from the upstream Go modules pinned in
# lab/cluster/go.mod, unmodified, into a cache entry keyed by those pins:
#
#   ${GPUPASS_LAB_CACHE:-$HOME/.cache/gpupass-lab}/cluster-<key>/bin/
#     kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl   (k8s.io/kubernetes)
#     etcd                                                            (go.etcd.io/etcd/server/v3)
#     containerd containerd-shim-runc-v2 ctr                          (containerd/v2)
#     runc                                                            (opencontainers/runc)
#     crictl                                                          (sigs.k8s.io/cri-tools)
#     cni/bridge cni/host-device cni/host-local cni/loopback cni/portmap (containernetworking/plugins)
#     pause                 (k8s.io/kubernetes build/pause/linux/pause.c, gcc -static)
#
# Every binary is static (the lab guest has no libc): the Go ones with CGO_ENABLED=0, runc (whose
# nsenter is C) with cgo, libseccomp and -extldflags -static, pause with gcc -static.
#
# Usage: lab/cluster/build.sh [--print-dir]
#   --print-dir  print the cache entry's directory (whether built or not) and exit
# Environment: GPUPASS_LAB_CACHE (cache root), GO (the go command; default: the one
# lab/tools/go.sh finds or fetches: go >= 1.26 on PATH, in /usr/local/go, else go1.26.8 from the
# Go module proxy into the cache), GPUPASS_CLUSTER_JOBS (go build -p; default: nproc).
# Exit status: 0 built or already cached, 1 a component failed to build (named), 2 setup.
set -euo pipefail

# Bumped when this script changes what it builds or how (part of the cache key). 2: kubectl;
# 3: the CNI host-device plugin (the cluster lab's pod network on the lab's 6.12 kernel).
SCHEME=3

here=$(cd "$(dirname "$0")" && pwd)
cache=${GPUPASS_LAB_CACHE:-$HOME/.cache/gpupass-lab}

die() { echo "cluster build: $*" >&2; exit 2; }
GO=$("$here/../tools/go.sh") || die "no Go 1.26 (lab/tools/go.sh, above)"

# The pinned versions, read from go.mod (the single source of truth).
ver() { awk -v m="$1" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$here/go.mod"; }
k8s=$(ver k8s.io/kubernetes)
staging=$(awk '$1 == "k8s.io/api" && $2 == "=>" { print $4; exit }' "$here/go.mod")
containerd=$(ver github.com/containerd/containerd/v2)
runc=$(ver github.com/opencontainers/runc)
critools=$(ver sigs.k8s.io/cri-tools)
etcd=$(ver go.etcd.io/etcd/server/v3)
cni=$(ver github.com/containernetworking/plugins)
for v in k8s staging containerd runc critools etcd cni; do
  [ -n "${!v}" ] || die "lab/cluster/go.mod names no version for $v"
done
goversion=$("$GO" env GOVERSION)

# The key: the Kubernetes version for a human, a hash of everything that decides the bytes.
hash=$( { cat "$here/go.mod" "$here/go.sum"; echo "SCHEME=$SCHEME $goversion"; } | sha256sum | cut -c1-12)
entry="$cache/cluster-k8s${k8s#v}_$hash"
if [ "${1:-}" = --print-dir ]; then echo "$entry"; exit 0; fi

mkdir -p "$cache"
exec 9>"$entry.lock"
if ! flock -n 9; then
  echo "cluster build: another build of $entry is running; waiting for its lock"
  flock 9
fi
if [ -f "$entry/.complete" ]; then
  echo "cluster build: cached: $entry ($(cat "$entry/.complete"))"
  exit 0
fi

rm -rf "$entry"
mkdir -p "$entry/bin/cni"
bin=$entry/bin
start=$(date +%s)
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly
jobs=${GPUPASS_CLUSTER_JOBS:-$(nproc)}
cd "$here"

# step COMPONENT COMMAND...: runs one build step, timed; a failure names the component.
step() {
  local what=$1 t0 rc
  shift
  echo "== cluster build: $what"
  t0=$(date +%s)
  if "$@"; then
    echo "== cluster build: $what done in $(( $(date +%s) - t0 )) s"
  else
    rc=$?
    echo "cluster build: FAILED building $what (exit $rc; the output above says why); $entry is left incomplete" >&2
    exit 1
  fi
}

step "module download (go mod download)" "$GO" mod download

# k8s.io/component-base/version and client-go's copy carry the release (kube's
# hack/lib/version.sh sets the same variables); without them every component says v0.0.0-master.
kv=""
major=${k8s#v}; minor=${major#*.}; major=${major%%.*}; minor=${minor%%.*}
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kv+=" -X $p.gitVersion=$k8s -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
step "kubernetes $k8s (kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)" \
  env CGO_ENABLED=0 "$GO" build -p "$jobs" -trimpath -ldflags="-s -w$kv" -o "$bin/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl

# The package path ends in /v3, so go build would name the binary "server".
step "etcd $etcd" env CGO_ENABLED=0 "$GO" build -p "$jobs" -trimpath -ldflags='-s -w' -o "$bin/etcd" go.etcd.io/etcd/server/v3

# no_btrfs: the btrfs snapshotter needs cgo and the btrfs headers; the lab uses overlayfs.
step "containerd $containerd (containerd containerd-shim-runc-v2 ctr)" \
  env CGO_ENABLED=0 "$GO" build -p "$jobs" -trimpath -tags no_btrfs \
  -ldflags="-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd" -o "$bin/" \
  github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr

# runc's Makefile `static` target: cgo (nsenter), seccomp through libseccomp (libseccomp-dev,
# linked statically), netgo + osusergo so nothing wants glibc's NSS at run time.
[ -f /usr/lib/x86_64-linux-gnu/libseccomp.a ] || [ -n "$(find /usr/lib* -name libseccomp.a 2>/dev/null | head -1)" ] ||
  die "runc needs libseccomp.a (Debian: apt-get install libseccomp-dev; tests/install-deps.sh installs it)"
step "runc $runc (seccomp, static)" \
  env CGO_ENABLED=1 "$GO" build -p "$jobs" -trimpath -tags 'seccomp netgo osusergo urfave_cli_no_docs' \
  -ldflags="-s -w -X main.version=${runc#v} -extldflags -static" -o "$bin/runc" \
  github.com/opencontainers/runc

step "cri-tools $critools (crictl)" \
  env CGO_ENABLED=0 "$GO" build -p "$jobs" -trimpath -ldflags="-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$critools" \
  -o "$bin/" sigs.k8s.io/cri-tools/cmd/crictl

step "CNI plugins $cni (bridge host-device host-local loopback portmap)" \
  env CGO_ENABLED=0 "$GO" build -p "$jobs" -trimpath -ldflags="-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$cni" \
  -o "$bin/cni/" \
  github.com/containernetworking/plugins/plugins/main/bridge \
  github.com/containernetworking/plugins/plugins/main/host-device \
  github.com/containernetworking/plugins/plugins/ipam/host-local \
  github.com/containernetworking/plugins/plugins/main/loopback \
  github.com/containernetworking/plugins/plugins/meta/portmap

# pause: build/pause/Makefile's CFLAGS (-Os -Wall -Werror -static -DVERSION=v$(TAG)-$(REV)),
# with TAG from that Makefile and the release as REV (it is a git describe there).
kdir=$("$GO" list -m -f '{{.Dir}}' k8s.io/kubernetes)
ptag=$(awk '$1 == "TAG" && $2 == "?=" { print $3; exit }' "$kdir/build/pause/Makefile")
step "pause ${ptag:-?} (gcc -static, k8s.io/kubernetes $k8s build/pause/linux/pause.c)" \
  gcc -Os -Wall -Werror -static -DVERSION="v${ptag}-$k8s" -o "$bin/pause" "$kdir/build/pause/linux/pause.c"
strip "$bin/pause"

for b in "$bin"/* "$bin"/cni/*; do
  [ -f "$b" ] || continue
  if file "$b" 2>/dev/null | grep -q 'dynamically linked'; then
    echo "cluster build: FAILED: $b is dynamically linked (the lab guest has no libc)" >&2
    exit 1
  fi
done

{
  echo "k8s.io/kubernetes $k8s (k8s.io/* staging $staging)"
  echo "go.etcd.io/etcd/server/v3 $etcd"
  echo "github.com/containerd/containerd/v2 $containerd"
  echo "github.com/opencontainers/runc $runc"
  echo "sigs.k8s.io/cri-tools $critools"
  echo "github.com/containernetworking/plugins $cni"
  echo "pause $ptag"
  echo "$goversion SCHEME=$SCHEME"
} > "$entry/versions"
secs=$(( $(date +%s) - start ))
echo "built in ${secs} s on $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" > "$entry/.complete"
echo "cluster build: done: $entry ($(cat "$entry/.complete"))"
du -sh "$bin"
