"""Build the product image (services/Containerfile) with buildah, without a Docker engine or registry.

    python -m dev.image build [--tag dranet-py:0.1.0] [--out PATH]   # prints the archive path
    python -m dev.image import ARCHIVE --address SOCK [--namespace k8s.io]   # prints the reference

Steps, each cached under ``$DRANET_CACHE/image`` (default ``/var/cache/dranet-dev/image``) and
skipped when its inputs did not change:

1. ``base/base-<suite>-<key>.tar``: a Debian root filesystem from ``debootstrap --variant=minbase``
   with python3, python3-venv and pci.ids, security updates applied, docs and apt lists removed.
   The key covers the suite, the package list and ``BASE_RECIPE``. It becomes the local image
   ``localhost/dranet-base:<suite>-<key>`` in buildah's own storage (``containers-storage/``,
   configured by ``storage.conf`` there; the host's /var/lib/containers is never used).
2. ``wheels/<key>/``: every wheel the build installs (runtime dependencies, grpcio-tools, the build
   backend, pip), downloaded on the host for linux x86_64 CPython of the suite and mounted into the
   build, which runs with no network at all (pip in the build would otherwise need the host's CA
   for a TLS-intercepting proxy, and its index). The key covers pyproject.toml.
3. ``archives/<name>_<tag>-<key>.oci.tar`` (+ ``.json``): ``buildah bud`` of services/Containerfile
   on that base, pushed as an OCI archive named with the full reference (``docker.io/library/...``,
   which is what the kubelet asks containerd for when a Pod says ``image: dranet-py:0.1.0``). The
   key covers every build input: the Containerfile, .dockerignore, pyproject.toml, README.md,
   proto/, shared/ and services/ (without caches and generated code), this file and both keys
   above, so an unchanged tree is a no-op.

The archive is imported into a containerd with ``import_image`` (``ctr images import``). Progress
goes to stderr; stdout gets only the result. Needs root, buildah, debootstrap and runc.

Environment: ``DRANET_CACHE``; ``DRANET_IMAGE_ISOLATION`` (``oci``, the default: runc and no network
in the build; ``chroot``: the host's network); ``DRANET_IMAGE_STORAGE_DRIVER`` (default overlay, vfs
where overlay cannot stack); ``DRANET_DEBIAN_MIRROR`` and ``DRANET_DEBIAN_SECURITY_MIRROR``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from dev.cluster.cri_install import RuntimeCache

REPO = Path(__file__).resolve().parents[2]

SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "pci.ids")
# Bump when _make_rootfs changes what goes into the base tarball: cached tarballs are then rebuilt.
BASE_RECIPE = 1
# CPython and glibc of each suite: the wheelhouse is resolved for them.
SUITE_PYTHON = {"bookworm": "3.11"}
SUITE_GLIBC = {"bookworm": (2, 36)}
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
# Where the Containerfile's builder stage finds the wheelhouse (a read-only bind mount).
WHEELS_IN_BUILD = "/wheels"
# The files and directories the Containerfile copies; their content keys the archive.
INPUT_FILES = ("services/Containerfile", ".dockerignore", "pyproject.toml", "README.md")
INPUT_DIRS = ("proto", "shared", "services")
# Left out of the key as .dockerignore leaves them out of the build context.
_IGNORED_DIRS = frozenset({"__pycache__"})
_IGNORED_FILE = re.compile(r".*(\.py[co]|_pb2\.pyi?|_pb2_grpc\.py)$")
KEEP_ARCHIVES = 3
KEEP_WHEELHOUSES = 3
STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# containers/image keeps a cache of blob digests and compression at this fixed path for root,
# whatever the storage root; buildah 1.28 has no option to move it.
HOST_BLOB_CACHE = Path("/var/lib/containers/cache/blob-info-cache-v1.boltdb")


class ImageBuildError(RuntimeError):
    """A build step failed; the message names the step and carries the tail of its output."""


def _log(msg: str) -> None:
    print(f"[image] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# Cache layout


@dataclass(frozen=True)
class ImageCache:
    """``$DRANET_CACHE/image``: base tarballs, wheelhouses, buildah storage, archives."""

    dir: Path

    @classmethod
    def default(cls) -> ImageCache:
        return cls(Path(os.environ.get("DRANET_CACHE", "/var/cache/dranet-dev")) / "image")

    @property
    def base_dir(self) -> Path:
        return self.dir / "base"

    @property
    def wheels_dir(self) -> Path:
        return self.dir / "wheels"

    @property
    def archives_dir(self) -> Path:
        return self.dir / "archives"

    @property
    def tmp_dir(self) -> Path:
        return self.dir / "tmp"

    @property
    def storage_root(self) -> Path:
        return self.dir / "containers-storage"

    @property
    def storage_conf(self) -> Path:
        return self.dir / "storage.conf"

    @property
    def runroot(self) -> Path:
        # Under /run (a tmpfs on a normal boot): a reboot clears its mount and lock state, as
        # containers/storage expects.
        tag = hashlib.sha256(str(self.storage_root).encode()).hexdigest()[:8]
        return Path("/run/dranet-dev") / f"containers-{tag}"

    def archive_path(self, reference: str, key: str) -> Path:
        name = reference.rsplit("/", 1)[-1].replace(":", "_").replace("@", "_")
        return self.archives_dir / f"{name}-{key}.oci.tar"


@dataclass(frozen=True)
class BuiltImage:
    """The result of ``build``: the archive and what it holds."""

    reference: str  # e.g. docker.io/library/dranet-py:0.1.0, the name inside the archive
    archive: Path
    image_bytes: int  # uncompressed layers
    archive_bytes: int
    key: str
    built: bool  # False: the cached archive for this key was reused
    seconds: float  # this call's wall time
    build_seconds: float  # the time the archive took to build (when it was built)
    base_reference: str


# ----------------------------------------------------------------------------------------------
# Small process and file helpers


def _run(
    cmd: Sequence[str | Path],
    what: str,
    *,
    env: dict[str, str] | None = None,
    stream: bool = False,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; ImageBuildError naming ``what`` with the output's tail when it fails.

    ``stream``: copy its output to stderr as it comes (long steps), keeping the last lines; then
    ``timeout`` does not apply."""
    argv = [str(c) for c in cmd]
    try:
        if not stream:
            res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
            if res.returncode != 0:
                tail = "\n".join((res.stderr.strip() or res.stdout.strip()).splitlines()[-25:])
                raise ImageBuildError(f"{what} failed (exit {res.returncode}): {tail}")
            return res
        tail_lines: deque[str] = deque(maxlen=40)
        with subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                sys.stderr.write(line)
                tail_lines.append(line.rstrip("\n"))
            rc = proc.wait()
        if rc != 0:
            raise ImageBuildError(f"{what} failed (exit {rc}):\n" + "\n".join(tail_lines))
        return subprocess.CompletedProcess(argv, rc, "", "")
    except FileNotFoundError as e:
        raise ImageBuildError(f"{what}: {argv[0]} not found ({e.strerror})") from e
    except subprocess.TimeoutExpired as e:
        raise ImageBuildError(f"{what} timed out after {e.timeout:.0f} s") from e


def _need_tools(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise ImageBuildError(
            f"missing tools: {' '.join(missing)} "
            "(apt-get install -y --no-install-recommends buildah debootstrap runc)"
        )


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@contextlib.contextmanager
def _locked(cache: ImageCache) -> Iterator[None]:
    """One build (or image session) at a time on this cache. Not reentrant."""
    cache.dir.mkdir(parents=True, exist_ok=True)
    with open(cache.dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def _host_left_alone() -> Iterator[None]:
    """Remove what buildah adds under /var/lib/containers (``HOST_BLOB_CACHE`` and its
    directories) when it was not there before."""
    chain = (HOST_BLOB_CACHE.parent.parent, HOST_BLOB_CACHE.parent, HOST_BLOB_CACHE)
    created = [p for p in chain if not p.exists()]
    try:
        yield
    finally:
        for p in reversed(created):
            with contextlib.suppress(OSError):  # a directory someone else filled meanwhile stays
                if p.is_dir():
                    p.rmdir()
                else:
                    p.unlink()


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path``, deepest first."""
    prefix = str(path.resolve())
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mnt = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        if mnt == prefix or mnt.startswith(prefix + "/"):
            out.append(mnt)
    return sorted(out, key=len, reverse=True)


def _remove_tree(path: Path) -> None:
    """Unmount whatever is left below ``path`` (debootstrap mounts /proc and /sys in its target),
    then delete it; refuses to delete through a mount it could not detach."""
    if not path.exists():
        return
    for mnt in _mounts_under(path):
        subprocess.run(["umount", "--lazy", mnt], capture_output=True)
    left = _mounts_under(path)
    if left:
        raise ImageBuildError(f"cannot remove {path}: still mounted: {', '.join(left)}")
    shutil.rmtree(path)


def _remove_path(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink()


def _delete_files(top: Path, keep: str, empty_dirs: bool) -> None:
    """Delete the files below ``top`` not named ``keep`` (and then the emptied directories).
    Never follows a symbolic link: the tree is a root filesystem whose absolute links point into
    the host."""
    for dirpath, _dirnames, filenames in os.walk(top, topdown=False):
        for name in filenames:
            if name != keep:
                os.unlink(os.path.join(dirpath, name))
        if empty_dirs and dirpath != str(top) and not os.listdir(dirpath):
            os.rmdir(dirpath)


def _fs_type(path: Path) -> str:
    """The file system type of the mount holding ``path``."""
    real = str(path.resolve())
    best, fstype = "", ""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        mnt = fields[4]
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, fstype = mnt, fields[fields.index("-") + 1]
    return fstype


# ----------------------------------------------------------------------------------------------
# Step 1: the Debian base


def base_key(suite: str = SUITE, packages: Sequence[str] = BASE_PACKAGES) -> str:
    """The cache key of a base root filesystem: suite, sorted package list, recipe version."""
    spec = json.dumps({"suite": suite, "packages": sorted(packages), "recipe": BASE_RECIPE})
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def debian_mirrors(suite: str = SUITE) -> tuple[str, str]:
    """(archive, security) URIs: ``$DRANET_DEBIAN_MIRROR`` / ``$DRANET_DEBIAN_SECURITY_MIRROR``,
    else the host's deb822 sources when they list ``suite`` (the security archive defaults to the
    archive's URI with ``-security`` appended, as Debian lays them out)."""
    mirror, security = "", ""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for stanza in re.split(r"\n\s*\n", sources.read_text()):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(("#", " ")):
                    k, v = line.split(":", 1)
                    fields[k.strip().lower()] = v.strip()
            suites, uris = fields.get("suites", "").split(), fields.get("uris", "").split()
            if not uris:
                continue
            if suite in suites and not mirror:
                mirror = uris[0]
            if f"{suite}-security" in suites and not security:
                security = uris[0]
    mirror = os.environ.get("DRANET_DEBIAN_MIRROR") or mirror
    if not mirror:
        raise ImageBuildError(
            f"no Debian archive for {suite} in {sources}: set DRANET_DEBIAN_MIRROR to its URI"
        )
    security = os.environ.get("DRANET_DEBIAN_SECURITY_MIRROR") or security or mirror.rstrip("/") + "-security"
    return mirror, security


def _chroot(rootfs: Path, what: str, *cmd: str) -> None:
    env = {"PATH": STD_PATH, "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive", "HOME": "/root"}
    _run(["chroot", rootfs, *cmd], what, env=env, timeout=1800)


def _make_rootfs(rootfs: Path, suite: str, packages: Sequence[str]) -> None:
    """debootstrap ``rootfs``, apply the suite's updates, and strip what a container never reads."""
    mirror, security = debian_mirrors(suite)
    if not KEYRING.exists():
        raise ImageBuildError(f"debootstrap needs {KEYRING} (apt-get install debian-archive-keyring)")
    _log(f"debootstrap {suite} ({' '.join(packages)}) from {mirror}")
    try:
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(packages)}",
                f"--keyring={KEYRING}",
                "--arch=amd64",
                suite,
                rootfs,
                mirror,
            ],
            "debootstrap",
            timeout=1800,
        )
    except ImageBuildError as e:
        logf = rootfs / "debootstrap" / "debootstrap.log"
        if logf.exists():
            tail = "\n".join(logf.read_text(errors="replace").splitlines()[-15:])
            raise ImageBuildError(f"{e}\n--- {logf}:\n{tail}") from e
        raise
    signed = f"Signed-By: {KEYRING}"
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(
        f"Types: deb\nURIs: {mirror}\nSuites: {suite} {suite}-updates\nComponents: main\n{signed}\n\n"
        f"Types: deb\nURIs: {security}\nSuites: {suite}-security\nComponents: main\n{signed}\n"
    )
    # debootstrap reads only the release itself; point releases and security fixes come after.
    _log(f"applying {suite}-updates and {suite}-security")
    _chroot(rootfs, "apt-get update in the base", "apt-get", "-q", "update")
    _chroot(
        rootfs,
        "apt-get dist-upgrade in the base",
        "apt-get",
        "-y",
        "-q",
        "--no-install-recommends",
        "dist-upgrade",
    )
    _chroot(rootfs, "apt-get clean in the base", "apt-get", "clean")
    # The same exclusions for packages a derived image installs later, as Debian's slim images do.
    (rootfs / "etc/dpkg/dpkg.cfg.d/dranet-slim").write_text(
        "path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\n"
        "path-exclude /usr/share/man/*\npath-exclude /usr/share/info/*\n"
        "path-exclude /usr/share/locale/*\npath-include /usr/share/locale/locale.alias\n"
    )
    for sub in ("var/lib/apt/lists", "usr/share/man", "usr/share/info", "var/cache/apt", "tmp"):
        for p in (rootfs / sub).glob("*"):
            _remove_path(p)
    for p in (rootfs / "usr/share/locale").glob("*"):
        if p.name != "locale.alias":
            _remove_path(p)
    _delete_files(rootfs / "usr/share/doc", keep="copyright", empty_dirs=True)
    _delete_files(rootfs / "var/log", keep="", empty_dirs=False)
    for pattern in ("var/cache/debconf/*-old", "var/lib/dpkg/*-old"):
        for p in rootfs.glob(pattern):
            p.unlink()
    # The host's name and resolver leaked in from debootstrap; the runtime mounts its own.
    for name in ("etc/hostname", "etc/resolv.conf"):
        (rootfs / name).unlink(missing_ok=True)
        (rootfs / name).write_text("")
    python = SUITE_PYTHON[suite]
    if not (rootfs / f"usr/bin/python{python}").exists():
        raise ImageBuildError(f"the {suite} base has no /usr/bin/python{python}; SUITE_PYTHON is stale")


def base_tarball(cache: ImageCache, suite: str = SUITE, packages: Sequence[str] = BASE_PACKAGES) -> Path:
    """The cached base root filesystem tarball, made with debootstrap when missing."""
    tar = cache.base_dir / f"base-{suite}-{base_key(suite, packages)}.tar"
    if tar.exists():
        return tar
    _need_tools("debootstrap", "chroot", "tar")
    t0 = time.monotonic()
    cache.base_dir.mkdir(parents=True, exist_ok=True)
    cache.tmp_dir.mkdir(parents=True, exist_ok=True)
    work = cache.tmp_dir / f"rootfs-{os.getpid()}"
    _remove_tree(work)
    try:
        _make_rootfs(work, suite, packages)
        partial = tar.with_suffix(".tar.partial")
        _run(
            ["tar", "--numeric-owner", "--xattrs", "--xattrs-include=*", "-C", work, "-cf", partial, "."],
            "packing the base root filesystem",
        )
        partial.rename(tar)
    finally:
        _remove_tree(work)
        tar.with_suffix(".tar.partial").unlink(missing_ok=True)
    _log(f"base tarball {tar} ({tar.stat().st_size / 1e6:.1f} MB) in {time.monotonic() - t0:.1f} s")
    return tar


# ----------------------------------------------------------------------------------------------
# buildah in its own storage


def _storage_driver(cache: ImageCache) -> str:
    """overlay where the kernel can stack it on the cache's file system, vfs otherwise
    (``$DRANET_IMAGE_STORAGE_DRIVER`` overrides; keep one driver per storage directory)."""
    if os.environ.get("DRANET_IMAGE_STORAGE_DRIVER"):
        return os.environ["DRANET_IMAGE_STORAGE_DRIVER"]
    overlay = "overlay" in Path("/proc/filesystems").read_text().split()
    return "overlay" if overlay and _fs_type(cache.dir) not in ("overlay", "tmpfs") else "vfs"


def buildah_env(cache: ImageCache) -> dict[str, str]:
    """The environment for buildah (or podman) on this cache's storage, writing storage.conf."""
    cache.storage_root.mkdir(parents=True, exist_ok=True)
    cache.runroot.mkdir(parents=True, exist_ok=True)
    conf = (
        "[storage]\n"
        f'driver = "{_storage_driver(cache)}"\n'
        f"graphroot = {json.dumps(str(cache.storage_root))}\n"
        f"runroot = {json.dumps(str(cache.runroot))}\n"
    )
    if not cache.storage_conf.exists() or cache.storage_conf.read_text() != conf:
        cache.storage_conf.write_text(conf)
    cache.tmp_dir.mkdir(parents=True, exist_ok=True)
    # TMPDIR: buildah stages blobs there (image copies); under the cache, not the host's /var/tmp.
    return {**os.environ, "CONTAINERS_STORAGE_CONF": str(cache.storage_conf), "TMPDIR": str(cache.tmp_dir)}


def isolation() -> str:
    """buildah's isolation: ``oci`` (runc; lets the build run with no network), or ``chroot`` by
    ``$DRANET_IMAGE_ISOLATION``."""
    return os.environ.get("DRANET_IMAGE_ISOLATION", "oci")


def _isolation_args() -> list[str]:
    # chroot isolation can only share the host's network.
    return ["--isolation", "oci", "--network", "none"] if isolation() == "oci" else ["--isolation", "chroot"]


def _image_exists(env: dict[str, str], ref: str) -> bool:
    res = subprocess.run(["buildah", "inspect", "--type", "image", ref], capture_output=True, env=env)
    return res.returncode == 0


def _remove_stale_containers(env: dict[str, str]) -> None:
    """Working containers left by a killed build (the storage is ours alone, under the lock)."""
    res = _run(["buildah", "containers", "--quiet"], "listing buildah containers", env=env)
    ids = res.stdout.split()
    if ids:
        _log(f"removing {len(ids)} working container(s) left by an earlier run")
        _run(["buildah", "rm", *ids], "removing stale buildah containers", env=env)


def base_image(cache: ImageCache, suite: str = SUITE, packages: Sequence[str] = BASE_PACKAGES) -> str:
    """The base as an image in buildah's storage (``localhost/dranet-base:<suite>-<key>``), made
    from the cached tarball (``base_tarball``) when the storage lacks it."""
    ref = f"localhost/dranet-base:{suite}-{base_key(suite, packages)}"
    env = buildah_env(cache)
    if _image_exists(env, ref):
        return ref
    tarball = base_tarball(cache, suite, packages)
    _log(f"importing {tarball.name} as {ref}")
    ctr = _run(["buildah", "from", "scratch"], "buildah from scratch", env=env).stdout.strip()
    try:
        _run(["buildah", "add", ctr, tarball, "/"], "buildah add of the base tarball", env=env)
        _run(
            [
                "buildah",
                "config",
                "--env",
                f"PATH={STD_PATH}",
                "--env",
                "LANG=C.UTF-8",
                "--cmd",
                "/bin/bash",
                "--os",
                "linux",
                "--arch",
                "amd64",
                "--label",
                f"org.opencontainers.image.description=Debian {suite} minbase with {' '.join(packages)}",
                ctr,
            ],
            "buildah config of the base",
            env=env,
        )
        _run(["buildah", "commit", "--quiet", ctr, ref], "buildah commit of the base", env=env)
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True, env=env)
    return ref


# ----------------------------------------------------------------------------------------------
# Step 2: the wheelhouse


def _pyproject(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        return tomllib.load(f)


def wheel_requirements(pyproject: Path) -> list[str]:
    """What the build installs: the project's dependencies and `build` extra, grpcio-tools for code
    generation, the build backend's requirements and pip (the build upgrades it first)."""
    data = _pyproject(pyproject)
    reqs = list(data["project"].get("dependencies", []))
    reqs += data["project"].get("optional-dependencies", {}).get("build", [])
    reqs += ["grpcio-tools", *data.get("build-system", {}).get("requires", []), "pip"]
    return list(dict.fromkeys(reqs))


def _platforms(suite: str) -> list[str]:
    """Every manylinux tag the suite's glibc runs (pip does not widen a given --platform)."""
    major, minor = SUITE_GLIBC[suite]
    tags = [f"manylinux_{major}_{m}_x86_64" for m in range(minor, 4, -1)]
    return [*tags, "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def wheel_key(pyproject: Path, suite: str = SUITE) -> str:
    spec = json.dumps({"pyproject": _sha256_file(pyproject), "python": SUITE_PYTHON[suite], "recipe": 1})
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def wheelhouse(cache: ImageCache, pyproject: Path = REPO / "pyproject.toml", suite: str = SUITE) -> Path:
    """The cached directory of wheels for the build, downloaded on the host when missing."""
    dest = cache.wheels_dir / wheel_key(pyproject, suite)
    if (dest / "requirements.txt").exists():
        return dest
    reqs = wheel_requirements(pyproject)
    py = SUITE_PYTHON[suite]
    t0 = time.monotonic()
    _log(f"downloading wheels for CPython {py} linux x86_64: {' '.join(reqs)}")
    cache.wheels_dir.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        cmd: list[str | Path] = [sys.executable, "-m", "pip", "download", "--quiet", "--dest", partial]
        cmd += ["--only-binary=:all:", "--implementation", "cp", "--python-version", py]
        for abi in (f"cp{py.replace('.', '')}", "abi3", "none"):
            cmd += ["--abi", abi]
        for plat in _platforms(suite):
            cmd += ["--platform", plat]
        _run([*cmd, *reqs], "pip download of the wheelhouse (every dependency needs a wheel)", timeout=1800)
        (partial / "requirements.txt").write_text("\n".join(reqs) + "\n")
        partial.rename(dest)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    n = len(list(dest.glob("*.whl")))
    _log(f"wheelhouse {dest}: {n} wheels in {time.monotonic() - t0:.1f} s")
    _prune(sorted(cache.wheels_dir.iterdir(), key=lambda p: p.stat().st_mtime), KEEP_WHEELHOUSES, keep=dest)
    return dest


def _prune(paths: list[Path], keep_n: int, keep: Path) -> None:
    """Delete all but the newest ``keep_n`` of ``paths`` (oldest first), never ``keep``."""
    for p in paths[: max(0, len(paths) - keep_n)]:
        if p == keep:
            continue
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------
# Step 3: the image


def normalize_reference(tag: str) -> str:
    """Docker's normalization: ``dranet-py:0.1.0`` -> ``docker.io/library/dranet-py:0.1.0``, so
    the name in containerd is the one the kubelet looks up for ``image: dranet-py:0.1.0``."""
    name, sep, rest = tag.partition("@")
    last = name.rsplit("/", 1)[-1]
    if ":" not in last:
        name += ":latest"
    first = name.split("/", 1)[0]
    if "/" not in name or ("." not in first and ":" not in first and first != "localhost"):
        name = f"docker.io/{name}" if "/" in name else f"docker.io/library/{name}"
    return name + sep + rest


def default_tag(repo: Path = REPO) -> str:
    """``dranet-py:<the project's version>``, the chart's image.repository and appVersion."""
    return f"dranet-py:{_pyproject(repo / 'pyproject.toml')['project']['version']}"


def _input_files(repo: Path) -> list[Path]:
    files = [repo / f for f in INPUT_FILES if (repo / f).exists()]
    for d in INPUT_DIRS:
        for dirpath, dirnames, filenames in os.walk(repo / d):
            dirnames[:] = sorted(n for n in dirnames if n not in _IGNORED_DIRS)
            files += [Path(dirpath) / f for f in sorted(filenames) if not _IGNORED_FILE.match(f)]
    return sorted(set(files))


def input_key(repo: Path, reference: str, base: str, wheels: str) -> str:
    """The archive's cache key: every build input's path, exec bit and content, and the keys of the
    base and the wheelhouse."""
    h = hashlib.sha256()
    meta = {"reference": reference, "base": base, "wheels": wheels, "isolation": isolation()}
    h.update(json.dumps(meta, sort_keys=True).encode())
    for f in [*_input_files(repo), Path(__file__).resolve()]:
        rel = f.relative_to(repo) if f.is_relative_to(repo) else f
        h.update(f"\0{rel}\0{bool(f.stat().st_mode & 0o111)}\0{_sha256_file(f)}".encode())
    return h.hexdigest()[:16]


def image_bytes(archive: Path) -> int:
    """The uncompressed size of the layers of the (single) image in an OCI archive."""
    with tarfile.open(archive) as tf:

        def member(name: str) -> IO[bytes]:
            f = tf.extractfile(name)
            if f is None:
                raise ImageBuildError(f"{archive}: {name} is not a file")
            return f

        def blob(digest: str) -> IO[bytes]:
            return member("blobs/" + digest.replace(":", "/", 1))

        index = json.load(member("index.json"))
        manifest = json.load(blob(index["manifests"][0]["digest"]))
        total = 0
        for layer in manifest["layers"]:
            raw = blob(layer["digest"])
            stream: IO[bytes] | gzip.GzipFile = (
                gzip.GzipFile(fileobj=raw) if layer["mediaType"].endswith("gzip") else raw
            )
            while chunk := stream.read(1 << 20):
                total += len(chunk)
        return total


def archive_reference(archive: Path) -> str:
    """The image name recorded in an OCI archive (``org.opencontainers.image.ref.name``)."""
    with tarfile.open(archive) as tf:
        f = tf.extractfile("index.json")
        if f is None:
            raise ImageBuildError(f"{archive}: no index.json (not an OCI archive)")
        index = json.load(f)
    refs = [m.get("annotations", {}).get("org.opencontainers.image.ref.name", "") for m in index["manifests"]]
    if len(refs) != 1 or not refs[0]:
        raise ImageBuildError(f"{archive}: expected one named image, index.json has {refs}")
    return str(refs[0])


def _bud(cache: ImageCache, repo: Path, reference: str, base_ref: str, wheels: Path) -> None:
    env = buildah_env(cache)
    _run(
        [
            "buildah",
            "bud",
            *_isolation_args(),
            "--pull=never",
            "--layers=false",
            "--force-rm",
            "--build-arg",
            f"BASE={base_ref}",
            "--build-arg",
            "PIP_NO_INDEX=1",
            "--build-arg",
            f"PIP_FIND_LINKS={WHEELS_IN_BUILD}",
            "--volume",
            f"{wheels}:{WHEELS_IN_BUILD}:ro",
            "--file",
            repo / "services" / "Containerfile",
            "--tag",
            reference,
            repo,
        ],
        "buildah bud of services/Containerfile",
        env=env,
        stream=True,
    )


def build(
    tag: str | None = None,
    out: Path | None = None,
    cache: ImageCache | None = None,
    repo: Path = REPO,
) -> BuiltImage:
    """The image archive for this tree: the cached one, or built now (see the module docstring).

    ``out``: also copy the archive there (``BuiltImage.archive`` is then ``out``)."""
    t0 = time.monotonic()
    cache = cache or ImageCache.default()
    reference = normalize_reference(tag or default_tag(repo))
    bkey = base_key()
    key = input_key(repo, reference, bkey, wheel_key(repo / "pyproject.toml"))
    archive = cache.archive_path(reference, key)
    meta_path = archive.with_suffix(".json")
    with _locked(cache), _host_left_alone():
        if archive.exists() and meta_path.exists():
            meta = json.loads(meta_path.read_text())
            result = BuiltImage(
                reference=reference,
                archive=archive,
                image_bytes=int(meta["image_bytes"]),
                archive_bytes=archive.stat().st_size,
                key=key,
                built=False,
                seconds=0.0,
                build_seconds=float(meta["build_seconds"]),
                base_reference=str(meta["base_reference"]),
            )
            _log(f"{reference}: unchanged tree, reusing {archive}")
        else:
            if os.geteuid() != 0:
                raise ImageBuildError("building the image needs root (debootstrap, buildah storage)")
            _need_tools("buildah", "tar")
            if isolation() == "oci":
                _need_tools("runc")
            env = buildah_env(cache)
            _remove_stale_containers(env)
            base_ref = base_image(cache)
            wheels = wheelhouse(cache, repo / "pyproject.toml")
            _log(f"building {reference} on {base_ref}")
            tb = time.monotonic()
            try:
                _bud(cache, repo, reference, base_ref, wheels)
                cache.archives_dir.mkdir(parents=True, exist_ok=True)
                partial = archive.with_suffix(".partial")
                partial.unlink(missing_ok=True)
                _run(
                    ["buildah", "push", "--quiet", reference, f"oci-archive:{partial}:{reference}"],
                    f"buildah push of {reference} to an OCI archive",
                    env=env,
                )
                partial.rename(archive)
            finally:
                # The archive is the product; the storage keeps only the base between builds.
                subprocess.run(["buildah", "rmi", reference], capture_output=True, env=env)
                subprocess.run(["buildah", "rmi", "--prune"], capture_output=True, env=env)
                archive.with_suffix(".partial").unlink(missing_ok=True)
            build_seconds = time.monotonic() - tb
            _log(f"built and exported {reference} in {build_seconds:.1f} s")
            size = image_bytes(archive)
            meta = {
                "reference": reference,
                "image_bytes": size,
                "build_seconds": round(build_seconds, 1),
                "base_reference": base_ref,
                "wheelhouse": str(wheels),
            }
            meta_path.write_text(json.dumps(meta, indent=1) + "\n")
            archives = sorted(cache.archives_dir.glob("*.oci.tar"), key=lambda p: p.stat().st_mtime)
            for old in archives[: max(0, len(archives) - KEEP_ARCHIVES)]:
                if old != archive:
                    old.unlink(missing_ok=True)
                    old.with_suffix(".json").unlink(missing_ok=True)
            result = BuiltImage(
                reference=reference,
                archive=archive,
                image_bytes=size,
                archive_bytes=archive.stat().st_size,
                key=key,
                built=True,
                seconds=0.0,
                build_seconds=build_seconds,
                base_reference=base_ref,
            )
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(archive, out)
            result = dataclasses.replace(result, archive=out)
    result = dataclasses.replace(result, seconds=time.monotonic() - t0)
    _log(
        f"{reference}: {result.image_bytes / 1e6:.1f} MB uncompressed, "
        f"archive {result.archive_bytes / 1e6:.1f} MB, {result.seconds:.1f} s"
        + ("" if result.built else " (cached)")
    )
    return result


# ----------------------------------------------------------------------------------------------
# Using the archive


def import_image(
    archive: Path, containerd_address: str | Path, namespace: str = "k8s.io", ctr: Path | None = None
) -> str:
    """``ctr images import`` the archive into a containerd; returns the image reference as
    containerd names it (the archive's, e.g. ``docker.io/library/dranet-py:0.1.0``).

    ``ctr``: default the containerd 1.7 of the runtime cache (dev/cluster/install_runtime.sh)."""
    ctr = ctr or RuntimeCache.default().ctr
    reference = archive_reference(archive)
    base = [str(ctr), "--address", str(containerd_address), "--namespace", namespace]
    _run([*base, "images", "import", archive], f"ctr images import of {archive}", timeout=600)
    names = _run([*base, "images", "list", "--quiet"], "ctr images list").stdout.split()
    if reference not in names:
        raise ImageBuildError(
            f"containerd at {containerd_address} does not list {reference} after the import"
        )
    return reference


class ImageContainer:
    """A buildah working container of an archive's image, for checks (``run``); a context manager
    that removes the container and the image again. Holds the cache lock: do not call ``build``
    inside it."""

    def __init__(self, archive: Path, cache: ImageCache | None = None) -> None:
        self.archive = archive
        self.cache = cache or ImageCache.default()
        self.reference = archive_reference(archive)
        self.id = ""
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> ImageContainer:
        self._stack.enter_context(_locked(self.cache))
        self._stack.enter_context(_host_left_alone())
        try:
            self.env = buildah_env(self.cache)
            res = _run(
                ["buildah", "from", "--quiet", f"oci-archive:{self.archive}"],
                f"buildah from {self.archive}",
                env=self.env,
            )
            self.id = res.stdout.strip().splitlines()[-1]
        except BaseException:
            self._stack.close()
            raise
        return self

    def run(self, argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the container (the image's env and working directory, no network);
        the completed process, whatever its exit code."""
        return subprocess.run(
            ["buildah", "run", *_isolation_args(), self.id, "--", *argv],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
        )

    def __exit__(self, *exc: object) -> None:
        try:
            if self.id:
                subprocess.run(["buildah", "rm", self.id], capture_output=True, env=self.env)
            subprocess.run(["buildah", "rmi", self.reference], capture_output=True, env=self.env)
        finally:
            self._stack.close()


# ----------------------------------------------------------------------------------------------
# Command line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m dev.image", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or reuse) the image archive; prints its path")
    b.add_argument("--tag", help="image name (default dranet-py:<pyproject version>)")
    b.add_argument("--out", type=Path, help="also copy the archive here; prints this path")
    i = sub.add_parser("import", help="import an archive into a containerd; prints the reference")
    i.add_argument("archive", type=Path)
    i.add_argument("--address", required=True, help="containerd's gRPC socket")
    i.add_argument("--namespace", default="k8s.io")
    i.add_argument("--ctr", type=Path, help="the ctr binary (default: the runtime cache's)")
    args = p.parse_args(argv)
    try:
        if args.cmd == "build":
            print(build(args.tag, args.out).archive)
        else:
            print(import_image(args.archive, args.address, args.namespace, args.ctr))
    except ImageBuildError as e:
        print(f"[image] error: {e}", file=sys.stderr)
        return 1
    return 0
