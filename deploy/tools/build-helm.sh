#!/usr/bin/env bash
# Builds Helm (the `helm` command of docs/deploy.md and tests/it/deploy.rs) from its upstream Go
# module, helm.sh/helm/v4 at the version pinned in deploy/tools/go.mod (go.sum holds the hashes of
# it and of every dependency), unmodified, into a cache entry keyed by those pins:
#
#   ${GPUPASS_LAB_CACHE:-$HOME/.cache/gpupass-lab}/helm-<version>_<hash>/bin/helm
#                                                             .../bin/yaml2json
#
# yaml2json (deploy/tools/yaml2json) turns `helm template`'s YAML into JSON for the tests, with
# Kubernetes' own YAML reader (k8s.io/apimachinery, sigs.k8s.io/yaml, both already in Helm's
# module graph).
#
# Nothing is downloaded but Go modules from the module proxy (verified against go.sum). The binary
# is static (CGO_ENABLED=0), built with -trimpath and the version stamped as Helm's Makefile does.
#
# Usage: deploy/tools/build-helm.sh [--print-dir]
#   --print-dir  print the cache entry's directory (whether built or not) and exit
# Environment: GPUPASS_LAB_CACHE (cache root), GO (the go command; default: what lab/tools/go.sh
# finds or fetches, go >= 1.26, as for the cluster build), GOCACHE (Go's build cache, as always).
# Exit status: 0 built or already cached, 1 the build failed, 2 setup (no Go, bad arguments).
set -euo pipefail

# Bumped when this script changes what it builds or how (part of the cache key).
SCHEME=1

here=$(cd "$(dirname "$0")" && pwd)
cache=${GPUPASS_LAB_CACHE:-$HOME/.cache/gpupass-lab}

die() { echo "helm build: $*" >&2; exit 2; }
case ${1:-} in
  '' | --print-dir) ;;
  *) die "unknown argument '$1' (usage: $0 [--print-dir])" ;;
esac
# The one Go resolution of the repository (lab/tools/go.sh: $GO if set and new enough, go on
# PATH, /usr/local/go, else go1.26.8 from the module proxy; otherwise it says what to install).
GO=$("$here/../../lab/tools/go.sh") || die "no Go 1.26 (lab/tools/go.sh, above)"

version=$(awk '$1 == "helm.sh/helm/v4" && $2 ~ /^v/ { print $2; exit }' "$here/go.mod")
[ -n "$version" ] || die "deploy/tools/go.mod names no version for helm.sh/helm/v4"
goversion=$("$GO" env GOVERSION)
hash=$( { cat "$here/go.mod" "$here/go.sum" "$here/yaml2json/main.go"; echo "SCHEME=$SCHEME $goversion"; } | sha256sum | cut -c1-12)
entry="$cache/helm-${version#v}_$hash"
if [ "${1:-}" = --print-dir ]; then echo "$entry"; exit 0; fi

mkdir -p "$cache"
exec 9>"$entry.lock"
if ! flock -n 9; then
  echo "helm build: another build of $entry is running; waiting for its lock"
  flock 9
fi
if [ -f "$entry/.complete" ]; then
  echo "helm build: cached: $entry ($(cat "$entry/.complete"))"
  exit 0
fi

rm -rf "$entry"
mkdir -p "$entry/bin"
start=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
export GOTOOLCHAIN=local GOFLAGS=-mod=readonly
cd "$here"
echo "== helm build: helm.sh/helm/v4 $version with $goversion into $entry"
if ! "$GO" mod download helm.sh/helm/v4 k8s.io/apimachinery sigs.k8s.io/yaml; then
  echo "helm build: FAILED: go mod download helm.sh/helm/v4 $version (is the Go module proxy reachable? GOPROXY=$("$GO" env GOPROXY))" >&2
  exit 1
fi
# Helm's Makefile: -X internal/version.version (the release) and .gitTreeState; -s -w.
ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=$version -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
if ! CGO_ENABLED=0 "$GO" build -trimpath -ldflags="$ldflags" -o "$entry/bin/helm" helm.sh/helm/v4/cmd/helm; then
  echo "helm build: FAILED: go build helm.sh/helm/v4/cmd/helm (the output above says why); $entry is left incomplete" >&2
  exit 1
fi
if ! CGO_ENABLED=0 "$GO" build -trimpath -ldflags="-s -w" -o "$entry/bin/yaml2json" ./yaml2json; then
  echo "helm build: FAILED: go build deploy/tools/yaml2json (the output above says why); $entry is left incomplete" >&2
  exit 1
fi
got=$("$entry/bin/helm" version --template '{{.Version}}')
[ "$got" = "$version" ] || { echo "helm build: FAILED: the built helm says $got, not $version" >&2; exit 1; }
secs=$(( $(date +%s) - start ))
echo "built in ${secs} s on $(date -u +%Y-%m-%dT%H:%M:%SZ), $(nproc) cores, load before $load0, after $(cut -d' ' -f1-3 /proc/loadavg)" > "$entry/.complete"
echo "helm build: done: $entry ($(cat "$entry/.complete"))"
