"""Build the generated parts of the runtime cache: CRI Python stubs and the pause image.

Called by ``install_runtime.sh`` after it unpacked containerd and the CRI api.proto (Debian trixie)
into ``<cache>/root``:

    python -m dev.cluster.cri_install <cache>

- ``<cache>/cri/py/cri_runtime_v1/api_pb2*.py``: stubs generated from the upstream api.proto with
  its gogo import and gogo options removed (Go-only; they do not change the wire format). Nothing
  generated or upstream is committed; ``dev.cluster.cri`` imports them from the cache.
- ``<cache>/pause/pause.tar``: an OCI image layout holding one static binary built from ``pause.c``,
  named ``docker.io/local/pause:1``, so pods start without any registry.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
INSTALL_SCRIPT = HERE / "install_runtime.sh"
RUNC = "/usr/sbin/runc"
CNI_BIN_DIR = "/usr/lib/cni"
CRI_PROTO_IN_ROOT = Path("usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto")
STUB_PACKAGE = "cri_runtime_v1"
PAUSE_IMAGE = "docker.io/local/pause:1"


@dataclass(frozen=True)
class RuntimeCache:
    """The directory ``install_runtime.sh`` fills: containerd binaries, CRI stubs, pause image.

    Default ``$DRANET_CACHE/runtime`` (``/var/cache/dranet-dev/runtime``, outside the checkout), or
    ``$DRANET_RUNTIME_CACHE``.
    """

    dir: Path

    @classmethod
    def default(cls) -> RuntimeCache:
        cache = Path(os.environ.get("DRANET_CACHE", "/var/cache/dranet-dev"))
        return cls(Path(os.environ.get("DRANET_RUNTIME_CACHE", cache / "runtime")))

    @property
    def bin_dir(self) -> Path:
        return self.dir / "root" / "usr" / "bin"

    @property
    def containerd(self) -> Path:
        return self.bin_dir / "containerd"

    @property
    def ctr(self) -> Path:
        return self.bin_dir / "ctr"

    @property
    def stubs_dir(self) -> Path:
        return self.dir / "cri" / "py"

    @property
    def pause_tar(self) -> Path:
        return self.dir / "pause" / "pause.tar"

    def check(self) -> None:
        """FileNotFoundError naming the missing piece and the install command."""
        for need in (
            self.containerd,
            self.ctr,
            self.bin_dir / "containerd-shim-runc-v2",
            self.stubs_dir / STUB_PACKAGE / "api_pb2_grpc.py",
            self.pause_tar,
        ):
            if not need.exists():
                raise FileNotFoundError(f"{need} is missing; run {INSTALL_SCRIPT} {self.dir}")
        for tool in (RUNC, f"{CNI_BIN_DIR}/bridge", f"{CNI_BIN_DIR}/host-local", f"{CNI_BIN_DIR}/loopback"):
            if not os.access(tool, os.X_OK):
                raise FileNotFoundError(f"{tool} is missing; run {INSTALL_SCRIPT} {self.dir}")


_GOGO_LINE = re.compile(
    r'^\s*(import\s+"github\.com/gogo/protobuf/gogoproto/gogo\.proto"\s*;|option\s+\(gogoproto\.)'
)


def strip_gogo(text: str) -> str:
    """The api.proto text without its gogo import and file-level gogo options.

    ValueError if a gogo option remains (e.g. a field-level one this simple filter cannot drop).
    """
    kept = [line for line in text.splitlines() if not _GOGO_LINE.match(line)]
    out = "\n".join(kept) + "\n"
    if "gogoproto" in out:
        raise ValueError("CRI api.proto still mentions gogoproto after stripping the known lines")
    return out


def generate_stubs(cache: Path) -> Path:
    """Generate the CRI stubs into ``<cache>/cri/py``; returns that directory (the import root)."""
    from grpc_tools import protoc  # type: ignore[import-untyped]

    src = cache / "root" / CRI_PROTO_IN_ROOT
    if not src.is_file():
        raise FileNotFoundError(f"CRI api.proto not found at {src}; run install_runtime.sh")
    top = cache / "cri" / "py"
    pkg = top / STUB_PACKAGE
    if pkg.exists():
        shutil.rmtree(pkg)
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "api.proto").write_text(strip_gogo(src.read_text()))
    rc = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{top}",
            f"-I{Path(protoc.__file__).parent / '_proto'}",
            f"--python_out={top}",
            f"--pyi_out={top}",
            f"--grpc_python_out={top}",
            f"{STUB_PACKAGE}/api.proto",
        ]
    )
    if rc != 0:
        raise RuntimeError(f"protoc failed on {pkg / 'api.proto'} with exit code {rc}")
    return top


def _tar_bytes(files: dict[str, tuple[bytes, int]]) -> bytes:
    """A deterministic tar (fixed owner and mtime) of name -> (content, mode)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _blob(blobs: dict[str, tuple[bytes, int]], data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    blobs[f"blobs/sha256/{digest}"] = (data, 0o644)
    return f"sha256:{digest}", len(data)


def oci_image_tar(binary: bytes, entrypoint: str, image_name: str) -> bytes:
    """An OCI image layout tar with one uncompressed layer holding ``binary`` at ``entrypoint``."""
    blobs: dict[str, tuple[bytes, int]] = {}
    layer = _tar_bytes({entrypoint.lstrip("/"): (binary, 0o755)})
    layer_digest, layer_size = _blob(blobs, layer)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": [entrypoint], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }
    config_digest, config_size = _blob(blobs, json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": layer_size,
            }
        ],
    }
    manifest_digest, manifest_size = _blob(blobs, json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest_size,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    # containerd's importer names the image after this annotation.
                    "io.containerd.image.name": image_name,
                    "org.opencontainers.image.ref.name": image_name.rsplit(":", 1)[1],
                },
            }
        ],
    }
    files = {
        "oci-layout": (json.dumps({"imageLayoutVersion": "1.0.0"}).encode(), 0o644),
        "index.json": (json.dumps(index, sort_keys=True).encode(), 0o644),
        **blobs,
    }
    return _tar_bytes(files)


def build_pause_image(cache: Path) -> Path:
    """Compile pause.c statically and pack it as ``<cache>/pause/pause.tar``; returns the tar path."""
    out = cache / "pause"
    out.mkdir(parents=True, exist_ok=True)
    binary = out / "pause"
    subprocess.run(
        ["gcc", "-static", "-Os", "-s", "-o", str(binary), str(HERE / "pause.c")],
        check=True,
        capture_output=True,
    )
    tar = out / "pause.tar"
    tmp = tar.with_suffix(".tar.tmp")
    tmp.write_bytes(oci_image_tar(binary.read_bytes(), "/pause", PAUSE_IMAGE))
    tmp.replace(tar)
    return tar


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m dev.cluster.cri_install <cache-dir>", file=sys.stderr)
        return 2
    cache = Path(argv[0]).resolve()
    generate_stubs(cache)
    build_pause_image(cache)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
