"""Every rank reports the environment DeepSpeed's launcher started it with, and nothing else: no torch, no
process group, so the launch costs only its start. The notebook starts it with ``CUDA_VISIBLE_DEVICES`` set in
the launcher's environment, to show what the launcher does with it.

Run from a terminal:  CUDA_VISIBLE_DEVICES=1 deepspeed --num_gpus 2 scripts/00_rank_environment.py
"""
import argparse
import os

from course_utils.common.record import record
from course_utils.common.records.hello import RankEnvironment

# what DeepSpeed's per-node launcher sets for each rank (deepspeed/launcher/launch.py, main)
LAUNCHER_VARIABLES = ("CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK",
                      "CROSS_SIZE", "MASTER_ADDR", "MASTER_PORT")


def build_parser() -> argparse.ArgumentParser:
    """No options of its own; the launcher's ``--local_rank`` is read from ``LOCAL_RANK`` instead."""
    return argparse.ArgumentParser(description=__doc__)


def started_with() -> dict[str, str]:
    """The environment this process was started with. On Linux ``/proc/self/environ`` keeps it unchanged, also
    after the course's rank hook has emptied ``CUDA_VISIBLE_DEVICES`` in a CPU rank; elsewhere ``os.environ``."""
    try:
        with open("/proc/self/environ", "rb") as f:
            pairs = [item.decode(errors="replace").partition("=") for item in f.read().split(b"\0") if item]
        return {name: value for name, _, value in pairs}
    except OSError:
        return dict(os.environ)


def main(argv=None) -> None:
    build_parser().parse_known_args(argv)          # leaves the launcher's --local_rank=N aside
    received = started_with()
    rank = int(received["RANK"])
    seen = {name: received.get(name) for name in LAUNCHER_VARIABLES}
    print(f"rank {rank}: " + "  ".join(f"{name}={value}" for name, value in seen.items() if value is not None))
    record(RankEnvironment(rank=rank, received=seen, visible_now=os.environ.get("CUDA_VISIBLE_DEVICES")))


if __name__ == "__main__":
    main()
