"""Benchmarks of the runner (`make bench`): numbers printed, not asserted.

1. Runner overhead: course_utils.kernel.launch.deepspeed against a bare `deepspeed` command running the same
   hello script (goal: ≤ 1.10×).
2. What a launch costs against `python -c "import deepspeed"` (the interpreter starts it contains).
3. With --tests: the wall time of `make test` (goal ≤ 15 min on 2 cores once set up).
4. With --smoke NN [NN ...] (or all): each notebook's test file alone, one after another, as `make test` runs it
   (smoke parameters, every declared wrong answer replayed), against the budget of 75 s on 2 cores; beside it, how
   long `import deepspeed` takes here, the machine's speed (these machines differ by up to 2×: compare figures
   measured in one sitting). Only the notebooks' figures then.
"""
from __future__ import annotations

import argparse
import os
import shutil
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


SMOKE_BUDGET_S = 75


def smoke_seconds(notebooks: list[str]) -> None:
    """Each notebook's test file alone, timed (``pytest -p no:xdist``, a basetemp of its own under build/bench/)."""
    files = {p.name[len("test_nb_"):len("test_nb_") + 2]: p for p in sorted((paths.ROOT / "tests").glob("test_nb_*.py"))}
    chosen = sorted(files) if notebooks == ["all"] else notebooks
    unknown = [n for n in chosen if n not in files]
    if unknown:
        raise SystemExit(f"no test file for notebook(s) {unknown}: choose among {sorted(files)} or all")
    reference = statistics.median(timed(import_deepspeed) for _ in range(3))
    print(f"this machine: `import deepspeed` in {reference:.2f} s (median of 3)")
    over, failed = [], []
    for n in chosen:
        temp = paths.build_dir() / "bench" / f"smoke-{n}"
        shutil.rmtree(temp, ignore_errors=True)
        temp.parent.mkdir(parents=True, exist_ok=True)       # pytest makes the basetemp, not its parents
        began = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-q", str(files[n]), f"--basetemp={temp}"],
                              cwd=paths.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env={k: v for k, v in os.environ.items() if k != "COURSE_TRIALS"})   # every trial
        seconds = time.perf_counter() - began
        if done.returncode == 0:                               # a failure's executed notebook stays, to be read
            shutil.rmtree(temp, ignore_errors=True)
        verdict = "FAILED" if done.returncode else ("over" if seconds > SMOKE_BUDGET_S else "ok")
        over += [n] if seconds > SMOKE_BUDGET_S else []
        failed += [n] if done.returncode else []
        print(f"notebook {n}: {seconds:6.1f} s  ({seconds / SMOKE_BUDGET_S:4.2f} × the {SMOKE_BUDGET_S} s budget)  {verdict}"
              + (f"\n{done.stdout[-2000:]}" if done.returncode else ""))
    print(f"over the budget here: {' '.join(over) or 'none'}")
    if failed:
        raise SystemExit(f"the tests of notebook(s) {' '.join(failed)} failed: their times are not smoke runs' times")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--tests", action="store_true", help="also time the whole test suite as `make test` runs it")
    parser.add_argument("--smoke", nargs="+", metavar="NN", help="time these notebooks' test files alone (or: all)")
    a = parser.parse_args()
    if a.smoke:
        smoke_seconds(a.smoke)
        return
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
        print(f"make test: {t:.0f} s wall = {t / 60:.1f} min (goal ≤ 15 min on 2 cores once set up)")


if __name__ == "__main__":
    main()
