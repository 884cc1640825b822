"""``zero_to_fp32`` under a memory limit (notebook 09): convert a ZeRO-3 checkpoint in a child process that a memory
cgroup limits, and see which way of converting fits.

The two ways DeepSpeed's ``deepspeed/utils/zero_to_fp32.py`` offers:

- ``"eager"``: ``get_fp32_state_dict_from_zero_checkpoint(folder)`` (its default ``lazy_mode=False``) hands back every
  tensor whole (``to_torch_tensor``), then ``torch.save`` writes them: the whole model in memory at once;
- ``"sharded"``: the checkpoint's own ``zero_to_fp32.py`` with ``--max_shard_size``: the CLI reads in lazy mode
  (``GatheredTensor``: a parameter's slices stay in the memory-mapped optimizer files until ``.contiguous()``) and
  makes one shard whole at a time, saved and freed before the next.

The child loads torch and DeepSpeed first and only then writes its pid into the cgroup's ``cgroup.procs``, as notebook
16's rank does: the kernel charges a page to the cgroup a process is in when the page is allocated, so the limit counts
what the conversion allocates, not the interpreter. It reports its peak of anonymous memory above what it held when it
joined (``RssAnon`` of ``/proc/self/status``, sampled from a thread): the pages the limit cannot give back. The page
cache of the files it reads and writes is charged too, but the kernel reclaims it under the limit.

The child is :mod:`course_utils.rank.capped_conversion` (``python -m course_utils.rank.capped_conversion
eager|sharded CHECKPOINT OUT [--max_shard_size 8MB] [--cgroup_procs FILE]``); :func:`convert` runs it from the notebook.
"""
from __future__ import annotations

import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from course_utils.rank.capped_conversion import MODES, PEAK_LINE


@dataclass
class Conversion:
    """One conversion: its peak (``None`` when it did not finish), the files it wrote, and why it did not finish."""
    mode: str
    cap_mb: int | None
    peak_bytes: int | None = None
    files: list[str] = field(default_factory=list)
    killed: str | None = None        # the course's message when the out-of-memory killer ended it
    skipped: str | None = None       # why it did not run (no memory cgroup on this machine)
    command: str = ""

    @property
    def fitted(self) -> bool:
        return self.peak_bytes is not None


def killed_message(mode: str, cap_mb: int) -> str:
    """What a conversion ended by SIGKILL under a limit of ``cap_mb`` MiB tells the learner (the runner's words for a
    rank killed the same way, :data:`course_utils.kernel.launch.failures.SIGNAL_CAUSES`), and what to change."""
    from course_utils.kernel.launch.failures import SIGNAL_CAUSES

    name, cause = SIGNAL_CAUSES[9]
    cause = cause.split(" What to change:")[0].rstrip(".")
    return (f"zero_to_fp32 ({mode}) was killed by {name} (exit status -9) and left no Python traceback: {cause}, here "
            f"the {cap_mb} MiB limit. What to change: convert one shard at a time (the CLI's --max_shard_size, or "
            f"get_fp32_state_dict_from_zero_checkpoint(..., lazy_mode=True) and .contiguous() one tensor at a time), "
            f"or convert on a machine with more memory.")


def convert(mode: str, checkpoint: Path | str, out: Path | str, cap_mb: int | None = None, max_shard_size: str = "8MB",
            timeout: float = 300) -> Conversion:
    """Convert ZeRO checkpoint folder ``checkpoint`` into ``out`` (emptied first) the ``mode`` way, in a child process
    under a limit of ``cap_mb`` MiB (``None``: no limit, to measure its peak). A machine that gives no memory cgroup
    skips a limited conversion and says why; a conversion the limit ends comes back with the course's message."""
    import sys

    from course_utils.kernel.launch import CommandError, command
    from course_utils.kernel.launch.memcap import MemoryCapUnavailable, memory_cap

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    out = Path(out)
    shutil.rmtree(out, ignore_errors=True)
    args = [sys.executable, "-m", "course_utils.rank.capped_conversion", mode, str(checkpoint), str(out), "--max_shard_size", max_shard_size]
    done = Conversion(mode, cap_mb, command=" ".join(map(str, args[3:])))
    try:
        if cap_mb is None:
            output = command(args, timeout=timeout)
        else:
            with memory_cap(cap_mb) as procs:
                output = command(args + ["--cgroup_procs", str(procs)], timeout=timeout)
    except MemoryCapUnavailable as err:
        done.skipped = str(err)
        return done
    except CommandError as err:
        if not re.search(r"exited with -9\b", str(err)):
            raise
        done.killed = killed_message(mode, cap_mb)
        shutil.rmtree(out, ignore_errors=True)          # what it wrote before the kill is no checkpoint
        return done
    done.peak_bytes = int(output.split(PEAK_LINE)[1].split()[0])
    done.files = sorted(p.name for p in out.iterdir())
    return done
