#!/usr/bin/env bash
# Builds dranet, the driver we re-implement, as a test oracle and benchmark peer: the
# differential tests (tests/e2e/test_vs_dranet.py) and tests/bench/vs_dranet.py run it on the
# real cluster beside ours, one driver at a time. Nothing of its code enters the project.
#
# The Go module registry refuses sigs.k8s.io/dranet, so the source is the snapshot beside the
# checkout (../shared/peers/dranet-<DRANET_VERSION>.tar.gz, upstream commit DRANET_VERSION of
# dev/versions.env; DRANET_SRC overrides the path). Its dependencies come from the module
# registry. Cached outside the checkout, keyed by that commit: $CACHE/dranet-<v>/bin/dranet;
# Go's module and build caches are shared with dev/build-kube.sh under $CACHE/go.
#
#   dev/build-dranet.sh [CACHE]
#
# A machine without the snapshot skips the build with a message (the tests that need the
# binary then skip, naming it); a snapshot that is there but does not build is an error.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=dev/versions.env
source "$here/versions.env"
CACHE=${1:-${DRANET_CACHE:-/var/cache/dranet-dev}}
v=$DRANET_VERSION
out=$CACHE/dranet-$v
log() { printf '[build-dranet %s] %s\n' "$(date +%T)" "$*" >&2; }

# One build at a time (two set-ups on one machine wait for each other, then find it cached).
mkdir -p "$CACHE"
exec 9>"$CACHE/dranet-$v.lock"
flock 9
if [[ -x $out/bin/dranet ]]; then
    log "dranet $v: cached in $out/bin"
    exit 0
fi
src=${DRANET_SRC:-$here/../../shared/peers/dranet-$v.tar.gz}
if [[ ! -f $src ]]; then
    log "dranet $v: no source snapshot at $src; not built (the tests that need it will skip)"
    exit 0
fi

export GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build
export GOTOOLCHAIN=${GOTOOLCHAIN:-local} CGO_ENABLED=0
need=$(tar -xzOf "$src" dranet/go.mod | sed -nE 's/^go 1\.([0-9]+).*/\1/p')
have=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
if [[ $have -lt $need ]]; then
    log "dranet $v needs go1.$need, this machine has go1.$have"
    exit 1
fi

t0=$SECONDS
rm -rf "$out/src" && mkdir -p "$out/src" "$out/bin"
tar -xzf "$src" -C "$out/src"
(cd "$out/src/dranet" && go mod download && \
    go build -trimpath -ldflags "-s -w" -o "$out/bin/dranet.tmp" ./cmd/dranet)
mv "$out/bin/dranet.tmp" "$out/bin/dranet"
rm -rf "$out/src"
log "dranet $v: built in $((SECONDS - t0)) s, $(du -h "$out/bin/dranet" | cut -f1), $out/bin/dranet"
