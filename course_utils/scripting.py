"""Small pieces every training script of the course needs, so scripts show only what they teach."""
from __future__ import annotations

import argparse
import os
import random


def parse_args(parser: argparse.ArgumentParser | None = None, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the script's own options plus what the launcher adds (``--local_rank``) and the
    DeepSpeed config options (``--deepspeed_config`` / ``--deepspeed``)."""
    import deepspeed

    parser = parser or argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args(argv)


def seed_everything(seed: int) -> None:
    """The same seed for Python, NumPy and torch on every rank (so runs repeat exactly)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rank0_print(*args, **kwargs) -> None:
    """Print only on global rank 0 (other ranks' lines are in their own logs)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args, **kwargs, flush=True)


def finish() -> None:
    """End a rank cleanly: wait for every rank, then tear the process group down.

    Without this, a rank that exits while its peers still hold connections to it can abort in
    gloo's destructor ("terminate called without an active exception").
    """
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
