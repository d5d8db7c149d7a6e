"""The product image built by dev/image from services/Containerfile: what its runtime stage holds,
what it must not hold, and that containerd imports and runs it under the name the chart uses.

The first test builds the image when the tree changed since the cached archive (about 30 s
with the base and wheelhouse cached, two without), otherwise it reuses it.
"""

from __future__ import annotations

import asyncio
import json
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from dev.cluster.containerd import Containerd
from dev.cluster.cri import ContainerConfig, CriClient, SandboxConfig
from dev.image.build import BuiltImage, ImageContainer, archive_reference, build, import_image

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
VENV = "/opt/dranet/venv"
# Packages of the build stage or of development that the runtime image must not carry.
ABSENT = [
    "grpc_tools",
    "pytest",
    "_pytest",
    "hypothesis",
    "mypy",
    "ruff",
    "helm_python",
    "kubernetes_validate",
    "pip",
]


def generated_modules() -> list[str]:
    """Module names of the code proto/generate.py makes from each .proto file."""
    out = []
    for src in sorted((REPO / "proto").rglob("*.proto")):
        mod = ".".join(src.relative_to(REPO).with_suffix("").parts)
        out += [f"{mod}_pb2", f"{mod}_pb2_grpc"]
    return out


# Runs in the image: imports and facts, printed as one JSON object.
PROBE = """
import importlib, importlib.util, json, os, shutil, sys
mods = sys.argv[1].split(",")
absent = sys.argv[2].split(",")
for m in mods:
    importlib.import_module(m)
from services.inventory.pciids import find_database
pyc_flags = {}
for m in ("services.store.__main__", "shared.adminctl", "proto.dranet.store.v1.store_pb2"):
    with open(importlib.util.cache_from_source(importlib.util.find_spec(m).origin), "rb") as f:
        pyc_flags[m] = int.from_bytes(f.read(8)[4:8], "little")
print(json.dumps({
    "executable": sys.executable,
    "prefix": sys.prefix,
    "which_python": shutil.which("python"),
    "which_admin": shutil.which("dranet-admin"),
    "present": [m for m in absent if importlib.util.find_spec(m) is not None],
    "dev_or_tests": [m for m in ("dev", "tests") if importlib.util.find_spec(m) is not None],
    "pci_ids": str(find_database() or ""),
    "pyc_flags": pyc_flags,
    "dont_write_bytecode": sys.flags.dont_write_bytecode,
    "unbuffered": os.environ.get("PYTHONUNBUFFERED"),
    "uid": os.getuid(),
}))
"""


@pytest.fixture(scope="module")
def image() -> BuiltImage:
    return build()


@pytest.fixture(scope="module")
def container(image: BuiltImage) -> Iterator[ImageContainer]:
    with ImageContainer(image.archive) as c:
        yield c


def test_archive_is_named_for_the_chart(image: BuiltImage) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert image.reference == f"docker.io/library/dranet-py:{version}"
    assert archive_reference(image.archive) == image.reference
    assert image.archive.stat().st_size == image.archive_bytes > 0
    assert image.image_bytes > image.archive_bytes


def test_runtime_stage_has_the_code_and_nothing_of_the_build(container: ImageContainer) -> None:
    mods = [f"services.{s}.__main__" for s in ("store", "inventory", "prepare", "attach")]
    # And the compiled extensions of the wheels, against the base's libc and libstdc++.
    mods += [
        "shared.adminctl",
        *generated_modules(),
        "grpc._cython.cygrpc",
        "lmdb.cpython",
        "re2",
        "pydantic_core",
    ]
    res = container.run(["python", "-c", PROBE, ",".join(mods), ",".join(ABSENT)])
    assert res.returncode == 0, res.stderr
    facts = json.loads(res.stdout)
    assert facts["executable"] == f"{VENV}/bin/python" and facts["prefix"] == VENV
    assert facts["which_python"] == f"{VENV}/bin/python"
    assert facts["present"] == [], f"build-only or development packages in the image: {facts['present']}"
    assert facts["dev_or_tests"] == []
    assert facts["pci_ids"] == "/usr/share/misc/pci.ids"
    # Byte code compiled at build time, hash-based and unchecked (flags 0b01): the root file
    # system is read-only at run time and nothing is recompiled at start.
    assert facts["pyc_flags"] == dict.fromkeys(facts["pyc_flags"], 1)
    assert facts["dont_write_bytecode"] == 1 and facts["unbuffered"] == "1"
    assert facts["uid"] == 0


def test_runtime_stage_file_system(container: ImageContainer) -> None:
    script = (
        "for p in /src /opt/gen /opt/dranet/venv/lib/python3.11/site-packages/dev "
        "/opt/dranet/venv/lib/python3.11/site-packages/tests; do test -e $p && echo $p; done; "
        "test -s /usr/share/misc/pci.ids || echo no-pci.ids; "
        "ls /opt/dranet/venv/lib/python3.11/site-packages | grep -i -E '^(grpcio_tools|pytest|hypothesis)' ; true"
    )
    res = container.run(["sh", "-c", script])
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == []


def test_admin_console_script(container: ImageContainer) -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"].get("scripts", {})
    if "dranet-admin" not in scripts:
        pytest.skip("pyproject.toml declares no [project.scripts] dranet-admin yet")
    res = container.run(["dranet-admin", "--help"])
    assert res.returncode == 0, res.stderr
    assert "health" in res.stdout


@pytest.mark.containerd
async def test_containerd_imports_and_runs_it(
    image: BuiltImage, containerd: Containerd, cri_client: CriClient
) -> None:
    ref = await asyncio.to_thread(import_image, image.archive, containerd.grpc_socket)
    assert ref == image.reference
    # The name a Pod spec uses (the chart's image.repository:tag), normalized by CRI like the kubelet's.
    short = ref.removeprefix("docker.io/library/")
    cfg = SandboxConfig(
        name="image-check",
        uid="uid-image-check",
        namespace="default",
        log_directory=str(containerd.pod_log_dir / "default_image-check"),
    )
    sid = await cri_client.run_pod_sandbox(cfg)
    containerd.note_netns((await cri_client.pod_sandbox_status(sid)).netns_path)
    cmd = ("python", "-c", "import sys, services.store.__main__; print('ok', sys.executable)")
    cid = await cri_client.create_container(sid, cfg, ContainerConfig(name="probe", image=short, command=cmd))
    await cri_client.start_container(cid)
    deadline = time.monotonic() + 60
    while (st := await cri_client.container_status(cid)).state != "CONTAINER_EXITED":
        assert time.monotonic() < deadline, f"container still {st.state} after 60 s"
        await asyncio.sleep(0.1)
    log = (Path(cfg.log_directory) / "probe" / "0.log").read_text()
    assert st.exit_code == 0, f"{st.reason} {st.message}\n{log}"
    assert f"ok {VENV}/bin/python" in log
    assert st.image == ref, f"CRI resolved {short} to {st.image}"
