#!/usr/bin/env bash
# Builds gpupass's container image: an OCI image layout, as one tar archive, that holds the static
# gpupass (`--features dra`, glibc linked in with +crt-static, as the QEMU lab builds its guest
# binary) and nothing else but the directories it runs in. Nothing is pulled from a registry: the
# layer, the config, the manifest and the index are written here with tar, gzip and sha256sum.
# docs/deploy.md says how to import it (`ctr -n k8s.io images import`, `podman load`).
#
# Reproducible: the same source (and toolchain) gives the same image digest. Every time stamp is
# SOURCE_DATE_EPOCH (default: the commit time of HEAD), the tar entries are sorted with owner
# 0:0 and fixed modes, gzip writes no name or time, the JSON is written in a fixed order, and the
# binary is built with the repository's and cargo's paths remapped and without the network
# (the pci-ids crate's build script tries `curl` for a newer pci.ids and falls back to its own
# copy; a `curl` that fails is first on PATH, so the compiled-in table is always the crate's).
#
# Usage: deploy/image/build.sh [--tag REF] [--binary PATH] [--profile PROFILE] [--out FILE]
#   --tag REF        the image's name (default gpupass.dev/gpupass:<Cargo.toml version>)
#   --binary PATH    package this static gpupass instead of building one (it must be a static
#                    x86-64 ELF with the dra-plugin command, e.g. the lab's
#                    target/lab/x86_64-unknown-linux-gnu/lab/gpupass)
#   --profile NAME   cargo profile of the build (default release; lab: quicker to build, slower)
#   --out FILE       the archive (default target/image/gpupass-<version>.oci.tar)
# Prints, last, one line: `image REF digest sha256:... size BYTES file FILE` (the digest is the
# manifest's, what `ctr images ls` and the Pod's imageID show).
# Exit status: 0 built, 1 the build failed, 2 bad arguments or a missing tool.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
triple=x86_64-unknown-linux-gnu

die() { echo "image build: $*" >&2; exit 2; }
fail() { echo "image build: FAILED: $*" >&2; exit 1; }

version=$(awk -F'"' '/^version *=/ { print $2; exit }' "$repo/Cargo.toml")
[ -n "$version" ] || die "cannot read the package version from $repo/Cargo.toml"
tag="gpupass.dev/gpupass:$version"
binary='' profile=release out="$repo/target/image/gpupass-$version.oci.tar"
while [ $# -gt 0 ]; do
  case $1 in
    --tag) [ $# -ge 2 ] || die "--tag needs a value (like gpupass.dev/gpupass:$version)"; tag=$2; shift 2 ;;
    --binary) [ $# -ge 2 ] || die "--binary needs a path"; binary=$2; shift 2 ;;
    --profile) [ $# -ge 2 ] || die "--profile needs a cargo profile name (release, lab)"; profile=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a file name"; out=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see $0 --help)" ;;
  esac
done
# A reference as the OCI distribution spec names one: [host[:port]/]path[:tag], lower case path.
[[ $tag =~ ^([a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]+)?/)?[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] ||
  die "invalid --tag '$tag': give NAME:TAG with a lower-case name, like gpupass.dev/gpupass:$version"
for t in tar gzip sha256sum strip file git; do
  command -v "$t" >/dev/null || die "$t not found (Debian: apt-get install tar gzip coreutils binutils file git)"
done

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git -C "$repo" log -1 --format=%ct 2>/dev/null) ||
    die "not a git checkout and no SOURCE_DATE_EPOCH: set SOURCE_DATE_EPOCH=<seconds since 1970>"
fi
[[ $SOURCE_DATE_EPOCH =~ ^[0-9]+$ ]] || die "SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH is not a number of seconds"
export SOURCE_DATE_EPOCH
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)

# ---------------------------------------------------------------- the binary
if [ -z "$binary" ]; then
  command -v cargo >/dev/null || die "cargo not found (https://rustup.rs), or give --binary PATH"
  case $profile in dev) dir=debug ;; *) dir=$profile ;; esac
  binary=$repo/target/image/$triple/$dir/gpupass
  cargo_home=${CARGO_HOME:-$HOME/.cargo}
  nocurl=$(mktemp -d)
  trap 'rm -rf "$nocurl"' EXIT
  printf '#!/bin/sh\necho "curl: disabled by deploy/image/build.sh (reproducible build)" >&2\nexit 1\n' >"$nocurl/curl"
  chmod +x "$nocurl/curl"
  rustflags="-C target-feature=+crt-static -C relocation-model=static"
  rustflags+=" --remap-path-prefix=$repo=/gpupass --remap-path-prefix=$cargo_home=/cargo"
  echo "image build: cargo build --locked --profile $profile --target $triple --target-dir target/image --bin gpupass --features dra (static)"
  (cd "$repo" && PATH="$nocurl:$PATH" RUSTFLAGS=$rustflags \
    cargo build --locked --profile "$profile" --target "$triple" --target-dir target/image --bin gpupass --features dra) ||
    fail "cargo build of the static gpupass (the output above says why)"
fi
[ -f "$binary" ] || die "no binary at $binary"
desc=$(file -b -L "$binary")
[[ $desc == ELF\ 64-bit*x86-64* ]] || fail "$binary is not an x86-64 ELF ($desc)"
[[ $desc == *"statically linked"* || $desc == *"static-pie linked"* ]] ||
  fail "$binary is not statically linked ($desc); the image has no libc: build it with -C target-feature=+crt-static"
"$binary" dra-plugin --help >/dev/null 2>&1 || fail "$binary has no dra-plugin command (build it with --features dra)"

# ---------------------------------------------------------------- the layout
work=$(mktemp -d)
trap 'rm -rf "$work" ${nocurl:+"$nocurl"}' EXIT
root=$work/rootfs
layout=$work/layout
mkdir -p "$root/usr/bin" "$root/run" "$root/var" "$root/tmp" "$root/etc" "$layout/blobs/sha256"
# The binary, stripped (symbols only: panics still name the place in the message).
strip --strip-all -o "$root/usr/bin/gpupass" "$binary"
# /var/run is /run, as on the hosts: the host's /run/gpupass (journal, lock) and /var/run/cdi
# are mounted once and gpupass finds both spellings; the service account token
# (/var/run/secrets/...) lands in /run.
ln -s ../run "$root/var/run"
chmod 0755 "$root" "$root/usr" "$root/usr/bin" "$root/run" "$root/var" "$root/etc"
chmod 0755 "$root/usr/bin/gpupass"
chmod 1777 "$root/tmp"
# tar ARCHIVE DIR: a reproducible tar of DIR's content (sorted, fixed time and owner).
rtar() {
  tar --create --file="$1" --directory="$2" --format=gnu --sort=name --numeric-owner --owner=0 --group=0 \
    --mtime="@$SOURCE_DATE_EPOCH" --no-acls --no-selinux --no-xattrs .
}
rtar "$work/layer.tar" "$root"
gzip -n -9 -c "$work/layer.tar" >"$work/layer.tar.gz"
diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
layer=$(sha256sum "$work/layer.tar.gz" | cut -d' ' -f1)
layer_size=$(stat -c %s "$work/layer.tar.gz")
mv "$work/layer.tar.gz" "$layout/blobs/sha256/$layer"

# blob FILE: moves FILE into the blobs, prints "<digest> <size>".
blob() {
  local d s
  d=$(sha256sum "$1" | cut -d' ' -f1)
  s=$(stat -c %s "$1")
  mv "$1" "$layout/blobs/sha256/$d"
  echo "$d $s"
}
# JSON strings here are ours (no quotes or backslashes); a tag was checked above.
printf '{"architecture":"amd64","os":"linux","created":"%s","author":"gpupass deploy/image/build.sh","config":{"Entrypoint":["/usr/bin/gpupass"],"Cmd":["dra-plugin"],"Env":["PATH=/usr/bin"],"Labels":{"org.opencontainers.image.title":"gpupass","org.opencontainers.image.version":"%s","org.opencontainers.image.revision":"%s","org.opencontainers.image.licenses":"Apache-2.0"}},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"%s","created_by":"deploy/image/build.sh: /usr/bin/gpupass (static, --features dra)"}]}' \
  "$created" "$version" "$revision" "$diff_id" "$created" >"$work/config.json"
read -r config config_size < <(blob "$work/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}],"annotations":{"org.opencontainers.image.created":"%s","org.opencontainers.image.version":"%s"}}' \
  "$config" "$config_size" "$layer" "$layer_size" "$created" "$version" >"$work/manifest.json"
read -r manifest manifest_size < <(blob "$work/manifest.json")
# Both names: containerd's import reads io.containerd.image.name, podman's the OCI ref.name.
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
  "$manifest" "$manifest_size" "$tag" "$tag" >"$layout/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
chmod -R u=rwX,go=rX "$layout"
mkdir -p "$(dirname "$out")"
rtar "$out.tmp" "$layout"
mv "$out.tmp" "$out"
echo "image build: layer $(stat -c %s "$work/layer.tar") bytes as tar, $layer_size gzipped; binary $(stat -c %s "$root/usr/bin/gpupass") bytes (stripped) from $binary"
echo "image $tag digest sha256:$manifest size $(stat -c %s "$out") file $out"
