#!/usr/bin/env bash
# The VM tier's toolchain (dev/vm/run.py boots it): QEMU, a Debian kernel unpacked (image and
# modules) with netdevsim built out of tree into its module tree, and virtme-ng in its own venv.
# Everything lands outside the checkout, in ${CACHE}/vm-<kernel ABI>; a finished cache is
# reused as is (stamp file), so re-running this is cheap.
#
#   dev/vm/install.sh [CACHE]      CACHE defaults to ${DRANET_CACHE:-/var/cache/dranet-dev}
#
# Prints the cache directory on stdout when done (progress goes to stderr).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=dev/vm/kernel.env
source "$HERE/kernel.env"

CACHE=${1:-${DRANET_CACHE:-/var/cache/dranet-dev}}
DIR="$CACHE/vm-$KERNEL_ABI"
STAMP="$DIR/.installed"
want="$KERNEL_ABI $KERNEL_PKG_VERSION virtme-ng==$VIRTME_NG_VERSION netdevsim"

log() { printf '[vm-install] %s\n' "$*" >&2; }

apt_ready=""
apt_install() {
    local need=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "${p%%=*}" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
    done
    [[ ${#need[@]} -eq 0 ]] && return 0
    export DEBIAN_FRONTEND=noninteractive
    if [[ -z $apt_ready ]]; then
        log "apt-get update"
        apt-get update -qq
        apt_ready=1
    fi
    log "apt-get install ${need[*]}"
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

# Host tools: QEMU (TCG; /dev/kvm here cannot run a stock kernel), busybox-static (virtme builds its
# initramfs with it: the 9p and virtio modules are not built in), kmod for depmod, iproute2's
# ip/rdma/devlink and ethtool (the guest sees the host's root filesystem, so these are the guest's
# tools too), and what the out-of-tree netdevsim build needs.
apt_install qemu-system-x86 qemu-system-data seabios ipxe-qemu kmod iproute2 ethtool \
    busybox-static make gcc-12 xz-utils "linux-headers-$KERNEL_ABI" python3

if [[ -f $STAMP && $(cat "$STAMP") == "$want" ]]; then
    log "cached: $DIR"
    echo "$DIR"
    exit 0
fi

log "building $DIR (kernel $KERNEL_ABI $KERNEL_PKG_VERSION)"
# A half-built cache (no stamp) is started over.
rm -rf "$DIR"
mkdir -p "$DIR/debs"
cd "$DIR/debs"

# --- the kernel: image and modules, unpacked ------------------------------------------------
log "downloading linux-image-$KERNEL_ABI=$KERNEL_PKG_VERSION and linux-source-6.1=$KERNEL_PKG_VERSION"
apt-get download -qq "linux-image-$KERNEL_ABI=$KERNEL_PKG_VERSION" "linux-source-6.1=$KERNEL_PKG_VERSION" \
    || { apt-get update -qq && apt-get download -qq "linux-image-$KERNEL_ABI=$KERNEL_PKG_VERSION" \
             "linux-source-6.1=$KERNEL_PKG_VERSION"; }
log "unpacking the kernel"
dpkg -x linux-image-"$KERNEL_ABI"_*.deb "$DIR/kernel"

# --- netdevsim, out of tree from the matching source -----------------------------------------
log "building netdevsim out of tree"
dpkg -x linux-source-6.1_*.deb "$DIR/src"
tar -C "$DIR/src" -xJf "$DIR/src/usr/src/linux-source-6.1.tar.xz" linux-source-6.1/drivers/net/netdevsim
NSIM="$DIR/src/linux-source-6.1/drivers/net/netdevsim"
make -s -C "/usr/src/linux-headers-$KERNEL_ABI" M="$NSIM" CONFIG_NETDEVSIM=m modules >&2
MODDIR="$DIR/kernel/lib/modules/$KERNEL_ABI"
install -D -m 0644 "$NSIM/netdevsim.ko" "$MODDIR/extra/netdevsim.ko"
rm -rf "$DIR/src"
depmod -b "$DIR/kernel" "$KERNEL_ABI"
modinfo -b "$DIR/kernel" -k "$KERNEL_ABI" -F vermagic netdevsim | grep -q "^$KERNEL_ABI " \
    || { log "netdevsim vermagic does not match $KERNEL_ABI"; exit 1; }

# --- virtme-ng in its own venv ---------------------------------------------------------------
log "virtme-ng $VIRTME_NG_VERSION in $DIR/venv"
"${PYTHON:-python3}" -m venv "$DIR/venv"
"$DIR/venv/bin/python" -m pip install -q --disable-pip-version-check "virtme-ng==$VIRTME_NG_VERSION"
rm -rf "$DIR/debs"
echo "$want" > "$STAMP"
log "ready: $DIR"
echo "$DIR"
