#!/usr/bin/env bash
# The host-side half of the cluster lab (docs/cluster.md): what the guest cannot make itself,
# made fresh for every boot and carried in the initramfs at /lab/cluster/ (lab/lab.sh runs this
# for a scenario that declares "# lab-carry: cluster"):
#
#   pki/      a CA of its own and every certificate and key the one-node cluster uses
#             (openssl; ECDSA P-256), valid for two days, never reused
#   *.kubeconfig   admin, kube-controller-manager, kube-scheduler, kubelet (the node "lab"),
#             kubelet-NAME for each node of CL_EXTRA_NODES (a two-node boot: "lab2")
#   images/   two OCI image archives for `ctr -n k8s.io images import`, built here from files
#             of this machine, never pulled: the sandbox image registry.k8s.io/pause:<TAG>
#             (Kubernetes' own pause, from the cluster build) and gpupass.dev/lab/busybox:<ver>
#             (Debian's static busybox with its applet links)
#   images.txt     "<archive> <image name>" per image
#   lib.sh    lab/cluster/guest.sh: brings the cluster up and down in the guest
#   dra/      the repo's contrib/dra/*.yaml (DeviceClasses, claim examples), applied as shipped
#
# Usage: [CL_SERVER=https://10.0.2.2:PORT] [CL_EXTRA_NODES="lab2"] lab/cluster/prep.sh BINDIR OUTDIR
#   BINDIR  the cluster build's bin/ (lab/cluster/build.sh --print-dir + /bin)
#   OUTDIR  created; what lands in the guest's /lab/cluster
# Exit status: 0 done, 2 a tool or input is missing (named).
set -euo pipefail
die() { echo "cluster prep: $*" >&2; exit 2; }
trap 'echo "cluster prep: failed at line $LINENO: $BASH_COMMAND" >&2' ERR
[ $# = 2 ] || die "usage: lab/cluster/prep.sh BINDIR OUTDIR"
bin=$1 out=$2
[ -x "$bin/pause" ] || die "no $bin/pause: run lab/cluster/build.sh first"
command -v openssl >/dev/null || die "openssl is missing (Debian: apt-get install openssl)"
[ -x /bin/busybox ] || die "/bin/busybox is missing (Debian: apt-get install busybox-static)"
file -L /bin/busybox | grep -q 'statically linked' || die "/bin/busybox is not static (busybox-static)"

# Where the guest sees these files.
G=/lab/cluster
mkdir -p "$out/pki" "$out/images"
# The guest's half: /lab/cluster/lib.sh, sourced by the cluster scenarios.
cp "$(dirname "$0")/guest.sh" "$out/lib.sh"
# The DRA manifests gpupass ships, for clusterdra to apply unchanged.
mkdir -p "$out/dra"
cp "$(dirname "$0")/../../contrib/dra/"*.yaml "$out/dra/"
pki=$out/pki

# --- certificates -------------------------------------------------------------------------
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$pki/$1.key" 2>/dev/null; }
key ca
openssl req -x509 -new -key "$pki/ca.key" -days 2 -subj "/CN=gpupass-lab-cluster-ca" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$pki/ca.crt" 2>/dev/null
# cert NAME SUBJECT EXTKEYUSAGE [SAN]: a leaf signed by the CA.
cert() {
  local ext
  key "$1"
  ext=$(mktemp)
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$3"
    [ -z "${4:-}" ] || echo "subjectAltName=$4"
  } > "$ext"
  openssl req -new -key "$pki/$1.key" -subj "$2" -out "$pki/$1.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$ext" -out "$pki/$1.crt" 2>/dev/null
  rm -f "$ext" "$pki/$1.csr"
}
# The API server listens on the host's loopback only (lab/cluster/host.sh); the guest reaches it
# as 10.0.2.2, QEMU's user-network address of the host. 10.96.0.1 is the "kubernetes" Service's
# address in --service-cluster-ip-range (never routed anywhere).
cert apiserver "/CN=kube-apiserver" serverAuth \
  "IP:127.0.0.1,IP:10.0.2.2,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.96.0.1"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
cert admin "/O=system:masters/CN=lab-admin" clientAuth
cert controller-manager "/CN=system:kube-controller-manager" clientAuth
cert scheduler "/CN=system:kube-scheduler" clientAuth
# The node authorizer and NodeRestriction know a kubelet by this name and group.
cert kubelet "/O=system:nodes/CN=system:node:lab" clientAuth
# A two-node boot (lab.sh, "# lab-nodes: 2"): CL_EXTRA_NODES names the other guests' nodes, each
# with its own kubelet certificate (kubelet-NAME.crt) and kubeconfig (kubelet-NAME.kubeconfig).
for n in ${CL_EXTRA_NODES:-}; do
  case $n in *[!a-z0-9-]*) die "CL_EXTRA_NODES: '$n' is not a node name (lowercase letters, digits, '-')" ;; esac
  cert "kubelet-$n" "/O=system:nodes/CN=system:node:$n" clientAuth
done
# The service-account token signer.
key sa
openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
rm -f "$pki/ca.srl"

# The guest's kubeconfigs name the API server as the guest reaches it (CL_SERVER, from lab.sh:
# https://10.0.2.2:<port>); host.sh rewrites copies for the host's loopback.
server=${CL_SERVER:-https://10.0.2.2:6443}
kubeconfig() { # NAME USER
  cat > "$out/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster:
    server: $server
    certificate-authority: $G/pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $G/pki/$1.crt
    client-key: $G/pki/$1.key
contexts:
- name: lab
  context: {cluster: lab, user: $2}
current-context: lab
EOF
}
kubeconfig admin lab-admin
kubeconfig controller-manager system:kube-controller-manager
kubeconfig scheduler system:kube-scheduler
kubeconfig kubelet system:node:lab
for n in ${CL_EXTRA_NODES:-}; do kubeconfig "kubelet-$n" "system:node:$n"; done

# --- the gpupass runtime handler's base OCI spec ----------------------------------------------
# containerd's own default spec (`ctr oci spec`, no daemon needed) with `gpupass oci-hook` as
# its createRuntime hook: the base_runtime_spec of the "gpupass" runtime handler in the guest's
# containerd config (lab/cluster/guest.sh), which a Pod picks with runtimeClassName: gpupass.
"$bin/ctr" oci spec > "$out/oci-default.json" || die "ctr oci spec failed"
python3 - "$out/oci-default.json" "$out/gpupass-hook-spec.json" <<'PY' || die "could not write the hook's base spec"
import json, sys
spec = json.load(open(sys.argv[1]))
spec.setdefault("hooks", {})["createRuntime"] = [
    {"path": "/bin/gpupass", "args": ["gpupass", "oci-hook"], "timeout": 20}
]
json.dump(spec, open(sys.argv[2], "w"), indent=2)
PY
rm -f "$out/oci-default.json"

# --- images ----------------------------------------------------------------------------------
# oci_image ARCHIVE NAME ROOTDIR CONFIG: an OCI image layout (one uncompressed layer made of
# ROOTDIR, owned by root, mtime 0) as a tar that `ctr images import` reads; NAME goes into the
# index as io.containerd.image.name. CONFIG is the image config's "config" object.
oci_image() {
  local archive=$1 name=$2 root=$3 config=$4 lay d layer ldig lsize cfg cdig csize man mdig msize
  lay=$(mktemp -d)
  mkdir -p "$lay/blobs/sha256"
  layer=$lay/layer.tar
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu -C "$root" -cf "$layer" .
  ldig=$(sha256sum "$layer" | cut -d' ' -f1); lsize=$(stat -c %s "$layer")
  mv "$layer" "$lay/blobs/sha256/$ldig"
  cfg="{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":$config,\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"sha256:$ldig\"]}}"
  printf '%s' "$cfg" > "$lay/cfg"
  cdig=$(sha256sum "$lay/cfg" | cut -d' ' -f1); csize=$(stat -c %s "$lay/cfg")
  mv "$lay/cfg" "$lay/blobs/sha256/$cdig"
  man="{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:$cdig\",\"size\":$csize},\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"sha256:$ldig\",\"size\":$lsize}]}"
  printf '%s' "$man" > "$lay/man"
  mdig=$(sha256sum "$lay/man" | cut -d' ' -f1); msize=$(stat -c %s "$lay/man")
  mv "$lay/man" "$lay/blobs/sha256/$mdig"
  printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"manifests\":[{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$mdig\",\"size\":$msize,\"platform\":{\"architecture\":\"amd64\",\"os\":\"linux\"},\"annotations\":{\"io.containerd.image.name\":\"$name\",\"org.opencontainers.image.ref.name\":\"${name##*:}\"}}]}" > "$lay/index.json"
  printf '%s' '{"imageLayoutVersion":"1.0.0"}' > "$lay/oci-layout"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu -C "$lay" \
    -cf "$archive" oci-layout index.json blobs
  rm -rf "$lay"
  echo "images/$(basename "$archive") $name" >> "$out/images.txt"
}
: > "$out/images.txt"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# pause: the TAG build.sh compiled it with (the entry's versions file: "pause <TAG>").
ptag=$(awk '$1 == "pause" { print $2 }' "$bin/../versions" 2>/dev/null)
[ -n "$ptag" ] || die "no pause version in $bin/../versions (an incomplete cluster build?)"
mkdir -p "$tmp/pause"
cp "$bin/pause" "$tmp/pause/pause"
oci_image "$out/images/pause.tar" "registry.k8s.io/pause:$ptag" "$tmp/pause" \
  '{"Entrypoint":["/pause"],"User":"65535:65535"}'
echo "$ptag" > "$out/pause-tag"

# busybox: the static binary, a link per applet, /etc/passwd and /etc/group for uid 0.
# (sed reads all of busybox's output: with `| head -1` busybox could die of SIGPIPE and
# pipefail end this script without a word, as it did under load.)
bbver=$(/bin/busybox 2>&1 | sed -n '1s/^BusyBox v\([0-9.]*\).*/\1/p')
[ -n "$bbver" ] || die "cannot read busybox's version"
r=$tmp/busybox
mkdir -p "$r/bin" "$r/etc" "$r/tmp" "$r/proc" "$r/sys" "$r/dev"
cp /bin/busybox "$r/bin/busybox"
for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "$r/bin/$a"; done
echo 'root:x:0:0:root:/root:/bin/sh' > "$r/etc/passwd"
echo 'root:x:0:' > "$r/etc/group"
oci_image "$out/images/busybox.tar" "gpupass.dev/lab/busybox:$bbver" "$r" \
  '{"Cmd":["sh"],"Env":["PATH=/bin"]}'
echo "gpupass.dev/lab/busybox:$bbver" > "$out/busybox-image"
