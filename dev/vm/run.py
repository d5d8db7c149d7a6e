#!/usr/bin/env python3
"""Run pytest inside a QEMU guest with a full Debian kernel (the VM tier).

    dev/vm/run.py [options] [TEST_PATH ...] [-- PYTEST_ARGS ...]   (default path: tests/vm/guest)

The guest is virtme-ng on the kernel that dev/vm/install.sh unpacked (with netdevsim built in
its module tree), under QEMU software emulation (TCG: /dev/kvm on these machines cannot run a
stock kernel). It sees the host's root filesystem read-only over 9p, runs as root, and writes
only into the run directory (``--out``, a fresh temporary one by default).

9p is slow for metadata here (about 10 ms a round trip under TCG, and Python's imports are
thousands of them), so the interpreter and the project's virtualenv travel as one ext4 image
(built once per virtualenv and cached next to the kernel) and the checkout as a tar file that
the guest unpacks into memory; both are mounted back at their host paths, so every absolute
path in the virtualenv still holds. The guest runs
``<venv>/bin/python -m pytest -p no:cacheprovider --junitxml=<out>/junit.xml PATHS`` with
DRANET_VM_GUEST=1 and hands back pytest.log, junit.xml, rc (pytest's exit code), dmesg.txt and
times.json through the run directory (vng's own exit code is always 255).

Prints the guest's pytest output as it comes and exits with pytest's exit code; 124 when the
guest ran out of time, 125 when the guest never got to run pytest.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_CACHE = os.environ.get("DRANET_CACHE", "/var/cache/dranet-dev")
DEFAULT_TESTS = ["tests/vm/guest"]
# What the checkout tar leaves out: the venv travels in the image; the rest is build output.
TAR_EXCLUDES = (
    "./.venv",
    "./.git",
    "./.cache",
    "./run",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "*.egg-info",
)
# Left out of the interpreter image: nothing a guest test imports, and most of its size.
BASE_EXCLUDES = ("site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3")
VENV_EXCLUDES = ("helm_python", "kubernetes_validate", "mypy", "mypyc")
NO_PYTEST = 125
TIMED_OUT = 124


def log(msg: str) -> None:
    print(f"[vm] {msg}", file=sys.stderr, flush=True)


def kernel_env() -> dict[str, str]:
    """dev/vm/kernel.env: the one place the kernel is pinned."""
    out = {}
    for line in (HERE / "kernel.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip()
    return out


def kernel_dir(cache: Path, install: bool) -> Path:
    """The unpacked kernel and virtme-ng (dev/vm/install.sh), installing them if asked."""
    abi = kernel_env()["KERNEL_ABI"]
    d = cache / f"vm-{abi}"
    if not (d / ".installed").exists():
        if not install:
            raise SystemExit(f"{d} is not installed: run dev/vm/install.sh {cache}")
        log(f"{d} missing: running dev/vm/install.sh")
        subprocess.run([str(HERE / "install.sh"), str(cache)], check=True, stdout=subprocess.DEVNULL)
    return d


# --- the interpreter image -------------------------------------------------------------------


def python_paths(venv: Path) -> tuple[Path, Path]:
    """(venv, base prefix) of the project's virtualenv, both resolved."""
    py = venv / "bin" / "python"
    if not py.exists():
        raise SystemExit(f"no virtualenv at {venv} (run .ci/setup)")
    base = subprocess.run(
        [str(py), "-c", "import sys; print(sys.base_prefix)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return venv.resolve(), Path(base).resolve()


def image_key(venv: Path, base: Path) -> str:
    """Changes when the virtualenv's packages or the interpreter change."""
    h = hashlib.sha256()
    h.update(f"{venv}\0{base}\0".encode())
    stamp = venv / ".dranet-installed"
    if stamp.exists():
        h.update(stamp.read_bytes())
    for d in sorted(venv.glob("lib/python*/site-packages")):
        h.update(f"{d}:{d.stat().st_mtime_ns}".encode())
    h.update(f"{(base / 'bin').stat().st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _copy_tree(src: Path, dst: Path) -> None:
    """Hard links where the filesystem allows (no data copied), else a copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["cp", "-al", str(src), str(dst)], capture_output=True)
    if res.returncode != 0:
        shutil.rmtree(dst, ignore_errors=True)
        subprocess.run(["cp", "-a", str(src), str(dst)], check=True)


def build_image(kdir: Path, venv: Path, base: Path, with_base: bool) -> Path:
    """<kdir>/pyenv-<key>.ext4 holding venv/ and base/ (cached; built under a lock)."""
    key = image_key(venv, base)
    img = kdir / f"pyenv-{key}.ext4"
    with open(kdir / ".pyenv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if img.exists():
            return img
        t0 = time.monotonic()
        stage = Path(tempfile.mkdtemp(prefix="pyenv-stage-", dir=kdir))
        try:
            _copy_tree(venv, stage / "venv")
            for sp in (stage / "venv").glob("lib/python*/site-packages"):
                for name in VENV_EXCLUDES:
                    shutil.rmtree(sp / name, ignore_errors=True)
                for so in sp.glob("*__mypyc*.so"):
                    so.unlink()
            if with_base:
                (stage / "base" / "lib").mkdir(parents=True)
                _copy_tree(base / "bin", stage / "base" / "bin")
                for lib in base.glob("lib/libpython*"):
                    _copy_tree(lib, stage / "base" / "lib" / lib.name)
                for stdlib in base.glob("lib/python3*"):
                    for entry in stdlib.iterdir():
                        if entry.name in BASE_EXCLUDES or entry.name.startswith("config-"):
                            continue
                        _copy_tree(entry, stage / "base" / "lib" / stdlib.name / entry.name)
                    (stage / "base" / "lib" / stdlib.name / "site-packages").mkdir(exist_ok=True)
            size = int(
                subprocess.run(["du", "-sk", str(stage)], capture_output=True, text=True).stdout.split()[0]
            )
            files = sum(len(f) + len(d) for _, d, f in os.walk(stage))
            tmp = img.with_suffix(".tmp")
            inodes = str(files + files // 4 + 1024)
            mkfs = ["mke2fs", "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-m", "0", "-L", "dnpyenv"]
            mkfs += ["-N", inodes, "-d", str(stage), str(tmp), f"{size * 5 // 4 + 65536}k"]
            subprocess.run(mkfs, check=True, stdout=subprocess.DEVNULL)
            tmp.rename(img)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        # Keep the two newest images (another checkout's CI run may use the other one).
        for old in sorted(kdir.glob("pyenv-*.ext4"), key=lambda p: p.stat().st_mtime, reverse=True)[2:]:
            old.unlink(missing_ok=True)
        log(f"built {img.name} ({img.stat().st_blocks * 512 >> 20} MiB) in {time.monotonic() - t0:.1f}s")
        return img


# --- one run ----------------------------------------------------------------------------------

GUEST_SCRIPT = r"""#!/bin/sh
# Generated by dev/vm/run.py: runs as root inside the guest.
OUT={out}
exec >"$OUT/guest.log" 2>&1
now() {{ echo "$(date +%s.%N) $(cut -d' ' -f1 /proc/uptime)"; }}
echo "start $(now)" >"$OUT/times.txt"
fail() {{ echo "guest set-up failed: $*"; dmesg >"$OUT/dmesg.txt"; echo {no_pytest} >"$OUT/rc"; exit 0; }}
set -x
for m in loop ext4; do modprobe $m || fail "modprobe $m"; done
mkdir -p /run/dn/env /run/dn/src
mount -o ro,loop {image} /run/dn/env || fail "mount {image}"
tar -xf "$OUT/src.tar" -C /run/dn/src || fail "unpack the checkout"
{mounts}
echo "ready $(now)" >>"$OUT/times.txt"
cd {root} || fail "cd {root}"
export DRANET_VM_GUEST=1 DRANET_VM_OUT="$OUT" PYTHONUNBUFFERED=1 HOME=/root
unset PYTHONDONTWRITEBYTECODE
timeout -k 10 {timeout} {python} {pyflags} -m pytest -p no:cacheprovider --junitxml="$OUT/junit.xml" {pytest_args} \
    >"$OUT/pytest.log" 2>&1
rc=$?
echo "done $(now)" >>"$OUT/times.txt"
dmesg >"$OUT/dmesg.txt"
echo $rc >"$OUT/rc"
"""


def guest_mounts(root: Path, venv: Path, base: Path, with_base: bool) -> str:
    """Bind the unpacked checkout and the image's trees over their host paths."""
    lines = []
    if venv.is_relative_to(root):
        lines.append(f"mkdir -p {shlex.quote(str(Path('/run/dn/src') / venv.relative_to(root)))}")
    lines.append(f"mount --bind /run/dn/src {shlex.quote(str(root))} || fail 'bind the checkout'")
    lines.append(f"mount --bind /run/dn/env/venv {shlex.quote(str(venv))} || fail 'bind the venv'")
    if with_base:
        lines.append(f"mount --bind /run/dn/env/base {shlex.quote(str(base))} || fail 'bind the interpreter'")
    return "\n".join(lines)


def follow(path: Path, stop: threading.Event) -> None:
    """Copy ``path`` to stdout as it grows, until ``stop`` (then the rest)."""
    pos = 0
    while True:
        done = stop.wait(1.0)
        with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
            f.seek(pos)
            data = f.read()
            pos += len(data)
            if data:
                sys.stdout.write(data.decode(errors="replace"))
                sys.stdout.flush()
        if done:
            return


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", help="test paths relative to the checkout (default tests/vm/guest)")
    p.add_argument(
        "--cache", default=DEFAULT_CACHE, help="where install.sh put the kernel (default %(default)s)"
    )
    p.add_argument(
        "--venv", default=str(ROOT / ".venv"), help="the project's virtualenv (default %(default)s)"
    )
    p.add_argument("--out", default="", help="run directory (default: a new one under /tmp, kept)")
    p.add_argument("--timeout", type=float, default=480.0, help="whole run, seconds (default %(default)s)")
    p.add_argument("--memory", default="2G", help="guest memory (default %(default)s)")
    p.add_argument("--cpus", default="2", help="guest CPUs (default %(default)s)")
    p.add_argument("--no-install", action="store_true", help="fail instead of running install.sh")
    p.add_argument(
        "--python-flag", action="append", default=[], help="an interpreter flag (e.g. -Ximporttime)"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="do not copy the guest's output to stdout")
    args = p.parse_args(argv)

    t0 = time.monotonic()
    cache = Path(args.cache)
    kdir = kernel_dir(cache, install=not args.no_install)
    abi = kernel_env()["KERNEL_ABI"]
    venv, base = python_paths(Path(args.venv))
    # A system interpreter (/usr) is on the guest's root already; a pyenv/own one travels too.
    with_base = not base.is_relative_to("/usr")
    image = build_image(kdir, venv, base, with_base)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="dranet-vm-"))
    out.mkdir(parents=True, exist_ok=True)
    for name in ("rc", "junit.xml", "pytest.log", "guest.log", "times.txt", "dmesg.txt"):
        (out / name).unlink(missing_ok=True)
    tar = ["tar", "-C", str(ROOT), "-cf", str(out / "src.tar")]
    tar += [f"--exclude={e}" for e in TAR_EXCLUDES] + ["."]
    subprocess.run(tar, check=True)
    paths = args.paths or DEFAULT_TESTS
    guest_timeout = max(int(args.timeout) - 90, 30)
    script = GUEST_SCRIPT.format(
        out=shlex.quote(str(out)),
        image=shlex.quote(str(image)),
        mounts=guest_mounts(ROOT, venv, base, with_base),
        root=shlex.quote(str(ROOT)),
        python=shlex.quote(str(venv / "bin" / "python")),
        timeout=guest_timeout,
        pyflags=" ".join(shlex.quote(f) for f in args.python_flag),
        pytest_args=" ".join(shlex.quote(a) for a in [*extra, *paths]),
        no_pytest=NO_PYTEST,
    )
    (out / "guest.sh").write_text(script)
    vng = kdir / "venv" / "bin" / "vng"
    cmd = [str(vng), "--disable-kvm", "--run", str(kdir / "kernel" / "boot" / f"vmlinuz-{abi}")]
    cmd += ["--memory", args.memory, "--cpus", args.cpus, f"--rwdir={out}", f"--rodir={kdir}"]
    cmd += ["--exec", f"sh {shlex.quote(str(out / 'guest.sh'))}"]
    env = {**os.environ, "PATH": f"{kdir / 'venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    prep = time.monotonic() - t0
    log(f"booting {abi} (TCG), run directory {out}")
    launched = time.time()
    stop = threading.Event()
    follower = None
    if not args.quiet:
        follower = threading.Thread(target=follow, args=(out / "pytest.log", stop), daemon=True)
        follower.start()
    timed_out = False
    with open(out / "console.log", "wb") as console:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=console,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=max(args.timeout - prep, 30))
        except subprocess.TimeoutExpired:
            timed_out = True
            log(f"the guest did not finish within {args.timeout:.0f}s: stopping QEMU")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait()
    finished = time.time()
    (out / "src.tar").unlink(missing_ok=True)  # 30 MB, made again for every run
    stop.set()
    if follower is not None:
        follower.join()
    times = _times(out / "times.txt", launched, finished, prep)
    (out / "times.json").write_text(json.dumps(times, indent=1) + "\n")
    log("times: " + ", ".join(f"{k} {v}s" for k, v in times.items()))
    rc_file = out / "rc"
    if not rc_file.exists():
        log(f"the guest wrote no exit code; its log ({out / 'guest.log'}):")
        for name in ("guest.log", "console.log"):
            with contextlib.suppress(FileNotFoundError):
                sys.stderr.write((out / name).read_text(errors="replace")[-4000:])
        return TIMED_OUT if timed_out else NO_PYTEST
    rc = int(rc_file.read_text().strip() or NO_PYTEST)
    if rc == NO_PYTEST:
        sys.stderr.write((out / "guest.log").read_text(errors="replace")[-4000:])
    log(f"guest pytest exit code {rc}; results in {out}")
    return rc


def _times(path: Path, launched: float, finished: float, prep: float) -> dict[str, float]:
    """Seconds: host preparation, boot (QEMU start to the guest script), guest set-up, pytest."""
    marks: dict[str, float] = {}
    with contextlib.suppress(FileNotFoundError):
        for line in path.read_text().splitlines():
            name, wall, _uptime = line.split()
            marks[name] = float(wall)
    out = {"prepare": round(prep, 1), "total": round(finished - launched + prep, 1)}
    if "start" in marks:
        out["boot"] = round(marks["start"] - launched, 1)
    if "ready" in marks and "start" in marks:
        out["guest_setup"] = round(marks["ready"] - marks["start"], 1)
    if "done" in marks and "ready" in marks:
        out["pytest"] = round(marks["done"] - marks["ready"], 1)
        out["shutdown"] = round(finished - marks["done"], 1)
    return out


if __name__ == "__main__":
    sys.exit(main())
