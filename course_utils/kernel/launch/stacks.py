"""A launch's Python stacks: each live rank's, asked for with SIGUSR1 (the rank hook's ``faulthandler`` writes
them to the run folder), and the main thread's frames of one dump, for a launch that hangs or fails.
"""
from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import psutil

from course_utils.common import run_folder


def rank_stacks(run_dir: Path, wait: float = 3.0) -> dict[int, str]:
    """Every live rank's Python stacks, all threads, as ``{rank: text}``: each rank of the launch in ``run_dir``
    gets SIGUSR1, on which the rank hook's ``faulthandler`` writes them to ``stacks/rank<N>-<pid>.txt``.

    faulthandler writes from its C signal handler, so a rank blocked inside a collective (in C++, without the
    GIL) answers too. Only processes whose environment names this run folder are signalled (a pid that has
    since been reused by another process is left alone). Waits up to ``wait`` seconds for the files to settle.
    """
    asked: dict[int, tuple[Path, int]] = {}
    for path in run_folder.stacks_files(run_dir):
        rank, _, pid = path.stem[len("rank"):].partition("-")
        try:
            proc = psutil.Process(int(pid))
            if proc.environ().get(run_folder.ENV) != str(run_dir):
                continue
            before = path.stat().st_size
            proc.send_signal(signal.SIGUSR1)
            asked[int(rank)] = (path, before)
        except (psutil.Error, ValueError, OSError):
            continue
    deadline, sizes = time.monotonic() + wait, {}
    while asked and time.monotonic() < deadline:
        now = {r: path.stat().st_size for r, (path, _) in asked.items()}
        if all(now[r] > before for r, (_, before) in asked.items()) and now == sizes:
            break
        sizes = now
        time.sleep(0.2)
    stacks = {}
    for rank, (path, before) in sorted(asked.items()):
        with open(path, "rb") as f:
            f.seek(before)
            text = f.read().decode(errors="replace")
        if text.strip():
            stacks[rank] = text
    return stacks


def main_thread_stack(text: str, frames: int = 12) -> str:
    """The main thread's frames from one faulthandler dump (the thread whose oldest frame is ``<module>``),
    most recent call first; of a deeper stack, the innermost and the outermost ``frames // 2`` (where it waits,
    and which line of the script got it there)."""
    blocks = [b for b in text.strip().split("\n\n") if "(most recent call first)" in b]
    main = next((b for b in blocks if b.rstrip().endswith("in <module>")), blocks[0] if blocks else "")
    lines = [_short_paths(line.strip()) for line in main.splitlines()[1:]]
    if len(lines) > frames:
        lines = lines[:frames // 2] + [f"... ({len(lines) - 2 * (frames // 2)} frames)"] + lines[-(frames // 2):]
    return "\n".join(lines)


def _short_paths(frame: str) -> str:
    """A faulthandler frame with installed packages named from their package (``torch/...``) and the
    course's own files from the repository root."""
    from course_utils.common import paths

    frame = re.sub(r'"[^"]*/site-packages/', '"', frame)
    return frame.replace(f'"{paths.ROOT}/', '"')
