"""Generate the Python protobuf/gRPC modules for every .proto file under proto/.

Run by the set-up step (.ci/setup). Output goes next to each .proto file as
``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py``; those files are gitignored and
never edited. The include root is the repository root, so generated imports read
``from proto.dranet.store.v1 import store_pb2``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"


def _outputs(src: Path) -> list[Path]:
    stem = src.with_suffix("")
    return [Path(f"{stem}_pb2.py"), Path(f"{stem}_pb2.pyi"), Path(f"{stem}_pb2_grpc.py")]


def stale(sources: list[Path]) -> bool:
    """True when any generated file is missing or older than any .proto source."""
    newest = max(s.stat().st_mtime for s in sources)
    for src in sources:
        for out in _outputs(src):
            if not out.exists() or out.stat().st_mtime < newest:
                return True
    return False


def main(argv: list[str]) -> int:
    sources = sorted(PROTO.rglob("*.proto"))
    if not sources:
        print("no .proto files under proto/", file=sys.stderr)
        return 1
    if "--force" not in argv and not stale(sources):
        return 0
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{Path(protoc.__file__).parent / '_proto'}",
        f"--python_out={ROOT}",
        f"--pyi_out={ROOT}",
        f"--grpc_python_out={ROOT}",
        *[str(s.relative_to(ROOT)) for s in sources],
    ]
    rc = protoc.main(args)
    if rc != 0:
        print(f"protoc failed with exit code {rc}", file=sys.stderr)
        return rc
    for src in sources:
        for out in _outputs(src):
            out.touch()
    print(f"[setup] generated Python code for {len(sources)} proto files", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
