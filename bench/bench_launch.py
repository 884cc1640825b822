"""Benchmarks of the runner (`make bench`): numbers printed, not asserted.

1. Runner overhead: course_utils.kernel.launch.deepspeed against a bare `deepspeed` command running the same
   hello script (goal: ≤ 1.10×).
2. What a launch costs against `python -c "import deepspeed"` (the interpreter starts it contains).
3. With --tests: the wall time of `make test` (goal ≤ 10 min on 2 cores once set up).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from course_utils.kernel import launch
from course_utils.common import paths

HELLO = paths.SCRIPTS / "00_hello.py"
BIN = Path(sys.executable).parent


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def bare_launch() -> None:
    port = launch.free_port()
    try:
        subprocess.run([str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", str(port), str(HELLO)],
                       cwd=paths.ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    finally:
        launch.release_shm_buffers(port)     # the runner does this itself; a bare launch leaks them


def runner_launch() -> None:
    launch.deepspeed(HELLO, procs=2, quiet=True, timeout=300)


def import_deepspeed() -> None:
    subprocess.run([sys.executable, "-c", "import deepspeed"], check=True, timeout=120,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tests", action="store_true", help="also time the whole test suite as `make test` runs it")
    a = parser.parse_args()
    runner_launch()                                   # warm caches (JIT ops, page cache) once
    rows = {}
    for name, fn in [("bare deepspeed launch", bare_launch), ("course_utils.kernel.launch", runner_launch),
                     ("python -c 'import deepspeed'", import_deepspeed)]:
        samples = [timed(fn) for _ in range(a.repeat)]
        rows[name] = statistics.median(samples)
        print(f"{name:32s} median {rows[name]:6.2f} s   (min {min(samples):.2f}, max {max(samples):.2f}, n={a.repeat})")
    ratio = rows["course_utils.kernel.launch"] / rows["bare deepspeed launch"]
    print(f"runner overhead: {ratio:.3f}× the bare launch (goal ≤ 1.10×)")
    per_import = rows["python -c 'import deepspeed'"]
    print(f"a 2-rank launch costs {rows['bare deepspeed launch'] / per_import:.1f}× "
          f"one `import deepspeed`")
    if a.tests:
        t = timed(lambda: subprocess.run(["make", "test"], cwd=paths.ROOT, check=True))
        print(f"make test: {t:.0f} s wall = {t / 60:.1f} min (goal ≤ 10 min on 2 cores once set up)")


if __name__ == "__main__":
    main()
