#!/usr/bin/env bash
# Builds the upstream test peers from Go modules: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet and kubectl (each pinned Kubernetes version), and etcd. Nothing of
# their code enters the project: they are the real cluster the tests and `make up` run on.
#
# Cached outside the checkout, keyed by version: $CACHE/kube-<v>/bin, $CACHE/etcd-<v>/bin; a
# binary that exists is not built again. Go's module and build caches live under $CACHE/go.
#
#   dev/build-kube.sh [CACHE [VERSION...]]   (default: every version of KUBE_VERSIONS in
#                                             dev/versions.env; the harness picks one with
#                                             DRANET_KUBE_VERSION, default KUBE_VERSION)
#
# Go: the machine's own (GOTOOLCHAIN=local) when it is at least what a module's go.mod names. A
# version whose go.mod needs a newer Go builds only with GOTOOLCHAIN=<that toolchain> exported
# by the caller (the go command then takes that toolchain from the module registry).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=dev/versions.env
source "$here/versions.env"
CACHE=${1:-${DRANET_CACHE:-/var/cache/dranet-dev}}
shift || true
VERSIONS=("$@")
[[ ${#VERSIONS[@]} -gt 0 ]] || read -r -a VERSIONS <<< "${KUBE_VERSIONS:-$KUBE_VERSION}"
log() { printf '[build-kube %s] %s\n' "$(date +%T)" "$*" >&2; }

export GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build GOFLAGS=-mod=mod
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
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
# The list of staging modules changes between minors: it is read from that version's own go.mod,
# and so are its `go` and `godebug` lines (a newer Go keeps that release's runtime defaults).
build_kube() {  # $1 = version (v1.x.y)
    local v=$1 out=$CACHE/kube-$1
    local bins=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)
    local missing=()
    for b in "${bins[@]}"; do [[ -x $out/bin/$b ]] || missing+=("$b"); done
    [[ ${#missing[@]} -eq 0 ]] && { log "kubernetes $v: cached in $out/bin"; return; }
    need_go 24
    local mod=$out/module minor=${v#v1.} staging upmod gover godebug t_all=$SECONDS
    minor=${minor%%.*}
    mkdir -p "$mod" "$out/bin"
    staging="0.${v#v1.}"
    log "kubernetes $v: reading its go.mod"
    upmod=$(cd "$out" && go list -m -f '{{.GoMod}}' "k8s.io/kubernetes@$v")
    gover=$(awk '$1 == "go" { print $2; exit }' "$upmod")
    godebug=$(awk '$1 == "godebug" && $2 != "(" { print; exit }' "$upmod")
    local -a mods
    mapfile -t mods < <(sed -nE 's#^[[:space:]]*k8s\.io/([a-z0-9-]+) => \./staging/src/k8s\.io/.*#\1#p' "$upmod")
    [[ ${#mods[@]} -gt 0 && -n $gover ]] || { log "kubernetes $v: no staging modules in $upmod"; exit 1; }
    need_go "$(echo "$gover" | cut -d. -f2)"
    log "kubernetes $v: go $gover, ${godebug:-no godebug}, ${#mods[@]} staging modules"
    {
        echo "module dranet.dev/kubebuild"
        echo "go $gover"
        [[ -n $godebug ]] && echo "$godebug"
        echo "require k8s.io/kubernetes $v"
        echo "replace ("
        for s in "${mods[@]}"; do echo "    k8s.io/$s => k8s.io/$s v$staging"; done
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
    log "kubernetes $v: built in $((SECONDS - t_all)) s"
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
for v in "${VERSIONS[@]}"; do build_kube "$v"; done
