#!/usr/bin/env bash
# Builds the upstream test peers from Go modules: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet and kubectl (one Kubernetes version), and etcd. Nothing of their code
# enters the project: they are the real cluster the tests and `make up` run on.
#
# Cached outside the checkout, keyed by version: $CACHE/kube-<v>/bin, $CACHE/etcd-<v>/bin; a
# binary that exists is not built again. Go's module and build caches live under $CACHE/go.
#
#   dev/build-kube.sh [CACHE]        (versions: dev/versions.env)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=dev/versions.env
source "$here/versions.env"
CACHE=${1:-${DRANET_CACHE:-/var/cache/dranet-dev}}
log() { printf '[build-kube %s] %s\n' "$(date +%T)" "$*" >&2; }

export GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build GOFLAGS=-mod=mod GOTOOLCHAIN=local
export CGO_ENABLED=0

need_go() {  # $1 = minimum minor version of Go 1.x
    local v
    if command -v go >/dev/null; then
        v=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
        [[ $v -ge $1 ]] && return 0
    fi
    [[ -x /usr/local/go/bin/go ]] && export PATH=/usr/local/go/bin:$PATH && \
        v=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/') && [[ $v -ge $1 ]] && return 0
    # No Go new enough: Debian's bookworm-backports golang (a package registry, never a download).
    log "installing Go from Debian packages (need go1.$1)"
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends -t bookworm-backports golang-go >/dev/null 2>&1 \
        || apt-get install -y -qq --no-install-recommends golang-go >/dev/null
    v=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
    [[ $v -ge $1 ]] || { log "Go go1.$v is older than go1.$1"; exit 1; }
}

# Kubernetes' go.mod requires every staging module at v0.0.0 with a replace block, which Go
# ignores outside the main module: a throwaway main module replaces each with v0.<minor>.<patch>.
build_kube() {
    local v=$KUBE_VERSION out=$CACHE/kube-$KUBE_VERSION
    local bins=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
    local missing=()
    for b in "${bins[@]}"; do [[ -x $out/bin/$b ]] || missing+=("$b"); done
    [[ ${#missing[@]} -eq 0 ]] && { log "kubernetes $v: cached in $out/bin"; return; }
    need_go 24
    local mod=$out/module minor=${v#v1.} staging
    minor=${minor%%.*}
    mkdir -p "$mod" "$out/bin"
    staging="0.${v#v1.}"
    {
        echo "module dranet.dev/kubebuild"
        echo "go 1.24.0"
        echo "godebug default=go1.24"
        echo "require k8s.io/kubernetes $v"
        echo "replace ("
        for s in $KUBE_STAGING; do echo "    k8s.io/$s => k8s.io/$s v$staging"; done
        echo ")"
    } > "$mod/go.mod"
    {
        echo "//go:build tools"
        echo "package tools"
        echo "import ("
        for b in "${bins[@]}"; do echo "    _ \"k8s.io/kubernetes/cmd/$b\""; done
        echo ")"
    } > "$mod/tools.go"
    log "kubernetes $v: resolving modules"
    (cd "$mod" && go mod tidy)
    local ld="-s -w" p
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ld+=" -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor"
        ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
    done
    for b in "${missing[@]}"; do
        local t0=$SECONDS
        log "kubernetes $v: building $b"
        (cd "$mod" && go build -p 2 -tags selinux,notest -ldflags "$ld" -o "$out/bin/$b.tmp" "k8s.io/kubernetes/cmd/$b")
        mv "$out/bin/$b.tmp" "$out/bin/$b"
        log "kubernetes $v: $b built in $((SECONDS - t0)) s"
    done
}

build_etcd() {
    local v=$ETCD_VERSION out=$CACHE/etcd-$ETCD_VERSION
    [[ -x $out/bin/etcd ]] && { log "etcd $v: cached in $out/bin"; return; }
    need_go 24
    mkdir -p "$out/module" "$out/bin"
    printf 'module dranet.dev/etcdbuild\ngo 1.25.0\n' > "$out/module/go.mod"
    printf '//go:build tools\npackage tools\nimport _ "go.etcd.io/etcd/server/v3"\n' > "$out/module/tools.go"
    local t0=$SECONDS
    log "etcd $v: resolving and building"
    (cd "$out/module" && go get "go.etcd.io/etcd/server/v3@$v" && go mod tidy &&
        go build -ldflags "-s -w" -o "$out/bin/etcd.tmp" go.etcd.io/etcd/server/v3)
    mv "$out/bin/etcd.tmp" "$out/bin/etcd"
    log "etcd $v: built in $((SECONDS - t0)) s"
}

mkdir -p "$CACHE"
build_etcd
build_kube
