#!/usr/bin/env bash
# Builds containerd 2.x (CONTAINERD2_VERSION in dev/versions.env) from its Go module, for the
# second node of the two-node cluster (tests/e2e/test_two_nodes.py; the first node keeps Debian's
# containerd 1.7). Nothing of its code enters the project.
#
# Cached outside the checkout, keyed by version: $CACHE/containerd-<v>/bin/{containerd,
# containerd-shim-runc-v2}; a binary that exists is not built again. Go's module and build caches
# are shared with dev/build-kube.sh under $CACHE/go.
#
#   dev/build-containerd.sh [CACHE [VERSION]]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=dev/versions.env
source "$here/versions.env"
CACHE=${1:-${DRANET_CACHE:-/var/cache/dranet-dev}}
V=${2:-$CONTAINERD2_VERSION}
log() { printf '[build-containerd %s] %s\n' "$(date +%T)" "$*" >&2; }

export GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build GOFLAGS=-mod=mod
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
export CGO_ENABLED=0
[[ -x /usr/local/go/bin/go ]] && export PATH=/usr/local/go/bin:$PATH

out=$CACHE/containerd-$V
bins=(containerd containerd-shim-runc-v2)
missing=()
for b in "${bins[@]}"; do [[ -x $out/bin/$b ]] || missing+=("$b"); done
[[ ${#missing[@]} -eq 0 ]] && { log "containerd $V: cached in $out/bin"; exit 0; }
command -v go >/dev/null || { log "no Go: run dev/build-kube.sh first (it installs one)"; exit 1; }

mkdir -p "$out/module" "$out/bin"
printf 'module dranet.dev/containerdbuild\ngo 1.24.0\n' > "$out/module/go.mod"
{
    echo "//go:build tools"
    echo "package tools"
    echo "import ("
    echo "    _ \"github.com/containerd/containerd/v2/cmd/containerd\""
    echo "    _ \"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2\""
    echo ")"
} > "$out/module/tools.go"
t0=$SECONDS
log "containerd $V: resolving modules"
(cd "$out/module" && go get "github.com/containerd/containerd/v2@$V" && go mod tidy)
p=github.com/containerd/containerd/v2/version
ld="-s -w -X $p.Version=$V -X $p.Revision=module"
for b in "${missing[@]}"; do
    log "containerd $V: building $b"
    (cd "$out/module" && go build -p 2 -tags "no_btrfs no_devmapper no_zfs" -ldflags "$ld" \
        -o "$out/bin/$b.tmp" "github.com/containerd/containerd/v2/cmd/$b")
    mv "$out/bin/$b.tmp" "$out/bin/$b"
done
log "containerd $V: built in $((SECONDS - t0)) s"
