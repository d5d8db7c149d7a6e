#!/usr/bin/env bash
# Install the real container runtime the development control plane and the tests use, into a
# cache outside the checkout (default /var/cache/dranet-dev/runtime). Idempotent; a no-op when already done.
#
#   dev/cluster/install_runtime.sh [CACHE_DIR]
#
# What it does (bookworm's containerd 1.6 has no NRI; trixie's 1.7 does and needs only libc):
#   - apt-get install (bookworm, the system sources): runc containernetworking-plugins gcc libc6-dev,
#     only those not installed yet.
#   - containerd 1.7 and the CRI api.proto from Debian trixie through a PRIVATE apt configuration under
#     CACHE_DIR/apt (the system's apt sources, lists and caches are never touched), unpacked with
#     dpkg -x into CACHE_DIR/root (containerd needs only libc).
#   - Python CRI stubs and the static pause image: `python -m dev.cluster.cri_install`.
#
# Needs root (apt-get), the Debian archive keyring and network access to the Debian archive only.
# PYTHON (default <repo>/.venv/bin/python) must have grpcio-tools installed.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${1:-${DRANET_CACHE:-/var/cache/dranet-dev}/runtime}
PY=${PYTHON:-$REPO/.venv/bin/python}
# Bump when this script or cri_install.py changes what lands in the cache.
FORMAT=1
STAMP=$CACHE/.installed

log() { printf '[install-runtime] %s\n' "$*" >&2; }

mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)

want_stamp() {
    printf 'format=%s\n' "$FORMAT"
    sha256sum "$HERE/cri_install.py" "$HERE/pause.c" | cut -d' ' -f1
}

apt_missing=()
for pkg in runc containernetworking-plugins gcc libc6-dev; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
        apt_missing+=("$pkg")
    fi
done

complete() {
    [[ -x $CACHE/root/usr/bin/containerd && -f $CACHE/cri/py/cri_runtime_v1/api_pb2_grpc.py
       && -f $CACHE/pause/pause.tar && -f $STAMP && "$(cat "$STAMP")" == "$(want_stamp)" ]]
}

if [[ ${#apt_missing[@]} -eq 0 ]] && complete; then
    exit 0
fi

if [[ ${#apt_missing[@]} -gt 0 ]]; then
    log "apt-get install ${apt_missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null
fi

# --- containerd and the CRI proto from trixie, through a private apt configuration ---------------
APT=$CACHE/apt
ROOT=$CACHE/root
if [[ ! -x $ROOT/usr/bin/containerd || ! -f $ROOT/usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto ]]; then
    mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/debs"
    uri=""
    if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
        uri=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources)
    fi
    if [[ -z $uri && -f /etc/apt/sources.list ]]; then
        uri=$(awk '$1=="deb"{for(i=2;i<=NF;i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list)
    fi
    [[ -n $uri ]] || { log "cannot find the Debian archive URI in the system apt sources"; exit 1; }
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri trixie main" > "$APT/sources.list"
    o=(-o "Dir::Etc::sourcelist=$APT/sources.list" -o "Dir::Etc::sourceparts=/dev/null"
       -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache"
       # The cache belongs to root; apt's unprivileged _apt download user cannot write there.
       -o "APT::Sandbox::User=root")
    log "fetching containerd and the CRI api from trixie (private apt config in $APT)"
    apt-get "${o[@]}" update -qq
    rm -f "$APT"/debs/*.deb
    (cd "$APT/debs" && apt-get "${o[@]}" download containerd golang-github-kubernetes-cri-api-dev >/dev/null)
    rm -rf "$ROOT.new"
    for deb in "$APT"/debs/*.deb; do
        dpkg -x "$deb" "$ROOT.new"
    done
    rm -rf "$ROOT"
    mv "$ROOT.new" "$ROOT"
fi
version=$("$ROOT/usr/bin/containerd" --version | awk '{print $3}')
case $version in
    1.7.*) ;;
    *) log "expected containerd 1.7.x from trixie, got $version"; exit 1 ;;
esac

# --- CRI stubs and the pause image ------------------------------------------------------------
(cd "$REPO" && "$PY" -m dev.cluster.cri_install "$CACHE")

want_stamp > "$STAMP"
log "ready: containerd $version, runc $(runc --version | awk 'NR==1{print $3}') in $CACHE"
