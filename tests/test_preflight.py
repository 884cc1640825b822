"""make preflight: each check's pass and fail path, driven with fakes (the machine's real state is not touched)."""
import subprocess
from pathlib import Path
from types import SimpleNamespace

from course_utils.tooling import preflight as pf

MiB, GiB = 2**20, 2**30


def shm(total_bytes):
    return lambda folder: SimpleNamespace(f_frsize=4096, f_blocks=total_bytes // 4096)


def test_python_cores_and_ram():
    assert pf.python_version((3, 11, 7)).status == "PASS"
    assert pf.python_version((3, 8, 10)).status == "FAIL"
    assert pf.cpu_cores(2).status == "PASS" and pf.cpu_cores(1).status == "WARN"
    assert pf.ram(16 * GiB).status == "PASS" and pf.ram(7 * GiB).status == "WARN" and pf.ram(2 * GiB).status == "FAIL"


def test_disk_space():
    free = lambda n: (lambda folder: SimpleNamespace(free=n))
    assert pf.disk(Path("/x"), free(50 * GiB)).status == "PASS"
    assert pf.disk(Path("/x"), free(9 * GiB)).status == "WARN"
    low = pf.disk(Path("/x"), free(2 * GiB))
    assert low.status == "FAIL" and "6 GiB" in low.todo


def test_compiler_on_path_or_not():
    assert pf.compiler(lambda c: "/usr/bin/g++" if c == "g++" else None).status == "PASS"
    missing = pf.compiler(lambda c: None)
    assert missing.status == "FAIL" and "build-essential" in missing.todo


def test_libaio_headers():
    assert pf.libaio(exists=lambda p: p == "/usr/include/libaio.h").status == "PASS"
    assert pf.libaio(exists=lambda p: False).status == "WARN"


def test_dev_shm_size_against_what_the_ranks_need():
    assert pf.dev_shm(statvfs=shm(8 * GiB), exists=lambda f: True).status == "PASS"
    docker_default = pf.dev_shm(statvfs=shm(64 * MiB), exists=lambda f: True)
    assert docker_default.status == "FAIL" and "--shm-size" in docker_default.todo
    assert pf.dev_shm(statvfs=shm(300 * MiB), exists=lambda f: True).status == "WARN"
    assert pf.dev_shm(exists=lambda f: False).status == "WARN"


def test_free_ports():
    assert pf.free_ports(2).status == "PASS"

    def refused():
        raise OSError("Operation not permitted")
    assert pf.free_ports(bind=refused).status == "FAIL"


def test_gpus_with_and_without_nvidia_smi():
    assert pf.gpus(which=lambda c: None).status == "PASS"
    answer = SimpleNamespace(returncode=0, stdout="NVIDIA H100 80GB HBM3, 550.54\n", stderr="")
    found = pf.gpus(run=lambda *a, **k: answer, which=lambda c: "/usr/bin/nvidia-smi")
    assert found.status == "PASS" and found.found.startswith("1: NVIDIA H100")
    broken = SimpleNamespace(returncode=9, stdout="", stderr="NVIDIA-SMI has failed")
    assert pf.gpus(run=lambda *a, **k: broken, which=lambda c: "/usr/bin/nvidia-smi").status == "WARN"


def test_the_launch_check_reads_the_launch(tmp_path):
    assert pf.launch_2_ranks(tmp_path / "absent" / "python").status == "WARN"
    python = tmp_path / "python"
    python.touch()
    ok = SimpleNamespace(returncode=0, stdout="...\nOK 2 9.1 2.13.0+cpu None False\n", stderr="")
    assert pf.launch_2_ranks(python, run=lambda *a, **k: ok).status == "PASS"
    failed = SimpleNamespace(returncode=1, stdout="", stderr="Traceback ...\nRuntimeError: gloo\n")
    assert pf.launch_2_ranks(python, run=lambda *a, **k: failed).status == "FAIL"

    def hangs(*a, **k):
        raise subprocess.TimeoutExpired("python", 1)
    assert pf.launch_2_ranks(python, run=hangs).status == "FAIL"


def test_the_table_says_what_to_do_and_the_verdict():
    text = pf.table([pf.Check("A", "PASS", "fine"), pf.Check("B", "FAIL", "broken", "fix it")])
    assert "PASS  A  fine" in text and "→ fix it" in text and "1 check(s) failed" in text
