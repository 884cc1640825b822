"""The child process of ``zero_to_fp32`` under a memory limit (notebook 09; the kernel side, and why, is
:mod:`course_utils.kernel.capped_conversion`): it loads torch and DeepSpeed, joins the memory cgroup, converts a ZeRO
checkpoint the ``eager`` way (``get_fp32_state_dict_from_zero_checkpoint`` + ``torch.save``) or the ``sharded`` way
(the checkpoint's own ``zero_to_fp32.py`` with ``--max_shard_size``, run in this process so that the interpreter it
loaded is not charged to the limit), and prints its peak of anonymous memory.

``python -m course_utils.rank.capped_conversion eager|sharded CHECKPOINT OUT [--max_shard_size 8MB] [--cgroup_procs FILE]``
"""
from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

PEAK_LINE = "peak anonymous memory above the start:"
MODES = ("eager", "sharded")


def _anonymous_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    raise OSError("no RssAnon in /proc/self/status")


class _PeakSampler(threading.Thread):
    """Samples this process's anonymous memory every millisecond; ``peak`` is the largest value above ``start``."""

    def __init__(self):
        super().__init__(daemon=True)
        self.start_bytes = self.peak = _anonymous_bytes()
        self.running = True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, _anonymous_bytes())
            time.sleep(0.001)

    def stop(self) -> int:
        self.running = False
        self.join()
        self.peak = max(self.peak, _anonymous_bytes())
        return self.peak - self.start_bytes


def main(argv: list[str] | None = None) -> None:
    import runpy
    import sys

    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    parser.add_argument("--max_shard_size", default="8MB", help="sharded: the CLI's --max_shard_size")
    parser.add_argument("--cgroup_procs", default=None, help="a memory cgroup's cgroup.procs to join once loaded")
    args = parser.parse_args(argv)
    if args.mode == "sharded":       # what the CLI's sharding imports on first use, loaded before the limit applies
        import torch.distributed.tensor  # noqa: F401  (~40 MB of modules, imported by huggingface_hub's sharding)
        from huggingface_hub import split_torch_state_dict_into_shards  # noqa: F401  (the CLI's sharding)
    # (the eager way imports neither, not even on first use: it spares those 0.6 s of CPU)
    if args.cgroup_procs:
        Path(args.cgroup_procs).write_text(str(__import__("os").getpid()))
    sys.setswitchinterval(1e-4)        # the sampler gets its turn between the converter's Python steps
    sampler = _PeakSampler()
    sampler.start()
    out = Path(args.out)
    if args.mode == "eager":
        state_dict = get_fp32_state_dict_from_zero_checkpoint(args.checkpoint)
        out.mkdir(parents=True, exist_ok=True)
        torch.save(state_dict, out / "pytorch_model.bin")
    else:
        script = Path(args.checkpoint) / "zero_to_fp32.py"      # the copy DeepSpeed put beside the checkpoint
        sys.argv = [str(script), args.checkpoint, args.out, "--max_shard_size", args.max_shard_size]
        runpy.run_path(str(script), run_name="__main__")
    print(PEAK_LINE, sampler.stop(), "bytes", flush=True)


if __name__ == "__main__":
    main()
