"""``make preflight``: will this machine run the course? A participant runs it before a workshop.

Standard library only, so it runs before any set-up (``python3 -m course_utils.tooling.preflight``), in well under a
minute. Each check says PASS, WARN or FAIL and, unless it passed, what to do; the table is printed and
written to ``build/preflight.txt`` for the participant to send to the instructor. When the course is
already set up (``.venv`` exists) it also starts a real 2-rank launch through the course's runner.

Every check takes what it inspects as arguments with the machine's real values as defaults, so the
tests drive each pass and fail path with fakes (a small ``/dev/shm``, no compiler, a full disk).
"""
from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from course_utils.common import paths

MiB, GiB = 2**20, 2**30
# DeepSpeed's CPU all-reduce keeps one shared-memory workspace per rank in /dev/shm: 2 × 32 MiB buffers plus two
# small ones (MAX_BUF_SIZE in deepspeed/ops/csrc/cpu/comm/shm.cpp), ~66 MiB. The course's largest launch has 4
# ranks, and make course runs two notebooks at once (4 + 2 ranks).
SHM_PER_RANK = 66 * MiB
SHM_NEEDED, SHM_MINIMUM = 6 * SHM_PER_RANK, 4 * SHM_PER_RANK
DISK_NEEDED, DISK_MINIMUM = 12 * GiB, 8 * GiB       # the environment (~6 GiB with torch and the ops) + build/
RAM_NEEDED, RAM_MINIMUM = 8 * GiB, 6 * GiB


@dataclass
class Check:
    name: str
    status: str          # "PASS" | "WARN" | "FAIL"
    found: str           # what the machine has
    todo: str = ""       # what to do, unless it passed


def python_version(version: tuple = tuple(sys.version_info[:3])) -> Check:
    found = ".".join(map(str, version))
    if version >= (3, 10):
        return Check("Python", "PASS", found)
    return Check("Python", "FAIL", found, "install Python 3.10 or newer (3.11 is what the course is tested with); "
                 "make uses python3.11 when it exists")


def cpu_cores(count: int | None = os.cpu_count()) -> Check:
    count = count or 1
    if count >= 2:
        return Check("CPU cores", "PASS", str(count))
    return Check("CPU cores", "WARN", str(count), "2 ranks share one core: every launch takes about twice as long; "
                 "give the VM 2 cores or more")


def _total_ram() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def ram(total: int | None = None) -> Check:
    total = _total_ram() if total is None else total
    found = f"{total / GiB:.1f} GiB"
    if total >= RAM_NEEDED:
        return Check("RAM", "PASS", found)
    if total >= RAM_MINIMUM:
        return Check("RAM", "WARN", found, "tight for 4-rank launches next to JupyterLab: close other programs")
    return Check("RAM", "FAIL", found, f"the course needs about {RAM_NEEDED / GiB:.0f} GiB (4 ranks each holding "
                 "torch, DeepSpeed and a model); use a machine or VM with more memory")


def disk(folder: Path = paths.ROOT, usage: Callable = shutil.disk_usage) -> Check:
    free = usage(folder).free
    found = f"{free / GiB:.1f} GiB free at {folder}"
    if free >= DISK_NEEDED:
        return Check("Disk", "PASS", found)
    if free >= DISK_MINIMUM:
        return Check("Disk", "WARN", found, f"enough to set up, little left for build/ (checkpoints, NVMe swap "
                     f"files); {DISK_NEEDED / GiB:.0f} GiB is comfortable")
    return Check("Disk", "FAIL", found, f"free {DISK_NEEDED / GiB:.0f} GiB: the environment (torch, DeepSpeed, "
                 "transformers and the built ops) takes about 6 GiB")


def compiler(which: Callable = shutil.which) -> Check:
    found = next((which(c) for c in ("c++", "g++", "clang++") if which(c)), None)
    if found:
        return Check("C++ compiler", "PASS", found)
    return Check("C++ compiler", "FAIL", "none on PATH", "DeepSpeed builds its CPU ops (cpu_adam, the shared-memory "
                 "all-reduce) with one: install build-essential (Debian/Ubuntu), gcc-c++ (Fedora) or the Xcode "
                 "command line tools (macOS)")


def libaio(headers: tuple = ("/usr/include/libaio.h", "/usr/local/include/libaio.h"),
           exists: Callable = os.path.exists) -> Check:
    found = next((h for h in headers if exists(h)), None)
    if found:
        return Check("libaio (NVMe offload)", "PASS", found)
    return Check("libaio (NVMe offload)", "WARN", "no libaio.h", "the NVMe runs of notebooks 04 and 16 need "
                 "DeepSpeed's async_io op: `make setup` installs libaio-dev where it runs as root with apt; else "
                 "`sudo apt install libaio-dev` (the rest of the course runs without it)")


def dev_shm(folder: str = "/dev/shm", statvfs: Callable = os.statvfs, exists: Callable = os.path.isdir) -> Check:
    if not exists(folder):
        return Check("/dev/shm", "WARN", "absent", "DeepSpeed's CPU all-reduce uses shared memory; without /dev/shm "
                     "it falls back to slower gloo collectives (macOS)")
    st = statvfs(folder)
    total = st.f_frsize * st.f_blocks
    found = f"{total / MiB:.0f} MiB"
    if total >= SHM_NEEDED:
        return Check("/dev/shm", "PASS", found)
    fix = ("each CPU rank keeps ~66 MiB there for DeepSpeed's all-reduce; containers often get 64 MiB: run the "
           "container with --shm-size=1g (docker) or mount a larger tmpfs")
    if total >= SHM_MINIMUM:
        return Check("/dev/shm", "WARN", found, f"enough for one 4-rank launch, not for two notebooks at once: "
                     f"run `make course COURSE_LANES=1`, or {fix}")
    return Check("/dev/shm", "FAIL", found, fix)


def free_ports(count: int = 4, bind: Callable | None = None) -> Check:
    def try_bind() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    bind = bind or try_bind
    try:
        ports = [bind() for _ in range(count)]
    except OSError as err:
        return Check("Local ports", "FAIL", str(err), "the ranks talk over 127.0.0.1: allow local TCP connections "
                     "(a firewall or a sandbox is blocking them)")
    return Check("Local ports", "PASS", f"{len(ports)} free on 127.0.0.1")


def gpus(run: Callable = subprocess.run, which: Callable = shutil.which) -> Check:
    if which("nvidia-smi") is None:
        return Check("GPUs", "PASS", "none (nvidia-smi absent): the course runs on CPU ranks")
    try:
        out = run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                  text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as err:
        return Check("GPUs", "WARN", f"nvidia-smi failed: {err}", "check the NVIDIA driver (nvidia-smi must work)")
    if out.returncode != 0:
        return Check("GPUs", "WARN", out.stderr.strip()[:120] or "nvidia-smi failed",
                     "the driver does not answer: the course will run on CPU unless torch sees the GPUs")
    names = [l.strip() for l in out.stdout.splitlines() if l.strip()]
    return Check("GPUs", "PASS", f"{len(names)}: " + "; ".join(names) + " (torch's CUDA build is checked by the "
                 "launch below once the course is set up)")


def launch_2_ranks(venv_python: Path = paths.ROOT / ".venv" / "bin" / "python", timeout: int = 120,
                   run: Callable = subprocess.run) -> Check:
    if not venv_python.exists():
        return Check("2-rank launch", "WARN", "not set up yet", "run `make course` (or `make setup`) once, then "
                     "`make preflight` again to try a real launch")
    code = ("import torch; from course_utils import launch; r = launch.deepspeed('00_hello.py', procs=2, timeout=90, "
            "quiet=True); print('OK', r.world_size, round(r.seconds, 1), torch.__version__, torch.version.cuda, "
            "torch.cuda.is_available())")
    try:
        out = run([str(venv_python), "-c", code], cwd=paths.ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Check("2-rank launch", "FAIL", f"no answer in {timeout} s", "see build/runs/ for the launch's log")
    last = (out.stdout.strip().splitlines() or [""])[-1].split()
    if out.returncode == 0 and last[:1] == ["OK"]:
        _, world, seconds, version, cuda, available = last
        return Check("2-rank launch", "PASS", f"{world} ranks in {seconds} s (torch {version}, CUDA build {cuda}, "
                     f"GPU usable: {available})")
    tail = " | ".join((out.stderr or out.stdout).strip().splitlines()[-3:])[:300]
    return Check("2-rank launch", "FAIL", tail, "send build/preflight.txt and the run folder under build/runs/ to "
                 "the instructor")


CHECKS = (python_version, cpu_cores, ram, disk, compiler, libaio, dev_shm, free_ports, gpus, launch_2_ranks)


def table(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"DeepSpeed course pre-flight — {platform.node()} ({platform.system()} {platform.machine()})", ""]
    for c in checks:
        lines.append(f"{c.status:4s}  {c.name:{width}s}  {c.found}")
        if c.todo:
            lines.append(f"{'':4s}  {'':{width}s}  → {c.todo}")
    failed = sum(c.status == "FAIL" for c in checks)
    warned = sum(c.status == "WARN" for c in checks)
    lines += ["", "Ready for the course." if not failed else f"{failed} check(s) failed: fix them before the day."]
    if warned:
        lines.append(f"{warned} warning(s): the course runs, with the limits named above.")
    return "\n".join(lines) + "\n"


def main() -> int:
    checks = [check() for check in CHECKS]
    text = table(checks)
    print(text, end="")
    out = paths.build_dir() / "preflight.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"(written to {out}: send it to your instructor)")
    return 1 if any(c.status == "FAIL" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
