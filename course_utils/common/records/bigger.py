"""Notebook 16 ("bigger than your device"): the configurations, the model sizes and the records of
``scripts/16_bigger_than_your_device.py``, named once for the rank and the notebook.

One launch per configuration: its one rank lives under a memory limit (a memory cgroup on a CPU, a cap on the
CUDA allocator on a GPU) and trains the sizes in :data:`SIZES` in ascending order until the limit stops it. Before
each size it records an :class:`Attempt`; after a size trained, a :class:`Trial` (losses, step time, where the
model states were, measured as notebook 04 measures them). A size that was attempted and never got its trial is
the one the limit stopped.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from course_utils.common.record import Record

# The GPT-2 family: GPT2Config with a small vocabulary and short sequences, so that the transformer blocks
# (12·n_embd² parameters each) are nearly all of the parameters. name → (n_embd, n_layer).
CPU_SIZES = {"3 M": (256, 4), "7 M": (320, 6), "11 M": (384, 6), "25 M": (512, 8), "48 M": (512, 15), "76 M": (512, 24)}
# The same family at a GPU's scale, about 1.5× apart: under a limit of an eighth of a GPU's memory (the course's rule for
# sized lessons, ``course_utils.kernel.hardware.SIZED_SHARE``) the notebook picks from here the sizes that stand to the
# limit as the CPU sizes stand to 352 MiB (``course_utils.kernel.views.bigger.sizes_for``)
GPU_SIZES = {"85 M": (768, 12), "120 M": (768, 17), "200 M": (1024, 16), "300 M": (1024, 24), "470 M": (1280, 24),
             "710 M": (1280, 36), "1.1 B": (1600, 36), "1.5 B": (1600, 48), "2.4 B": (2048, 48), "3.8 B": (2560, 48)}
SIZES = {**CPU_SIZES, **GPU_SIZES}
VOCAB, POSITIONS, HEADS = 512, 32, 8
SEQ_LEN, MICRO_BATCH = 16, 2
LR = 1e-4           # AdamW on one fixed batch: the loss falls at every step up to 48 M (measured over 5 steps; at
#                     3e-4 the 48 M model's loss rose again at its 4th step, the same with CPU offload and with NVMe)

# Each configuration: the ZeRO stage and the zero_optimization keys added to the course config of that stage.
# Buckets are kept small (1e6 elements): notebook 05 measured that a bucket is a real allocation, and the course
# configs' 5e7-element buckets alone would be 400 MB on a CPU rank. Small sub-groups keep NVMe's optimizer swapper's
# buffers (buffer_count × the largest sub-group) small.
SMALL_BUCKETS = {"reduce_bucket_size": 1e6, "allgather_bucket_size": 1e6}
STAGE3_SMALL = {"reduce_bucket_size": 1e6, "stage3_prefetch_bucket_size": 1e6, "stage3_max_live_parameters": 1e6,
                "stage3_max_reuse_distance": 1e6, "sub_group_size": 1e6}


def nvme_defaults(folder: str) -> dict:
    """The ``offload_optimizer`` and ``offload_param`` sections that put optimizer states and parameters in swap files
    under ``folder`` and leave every other key at DeepSpeed's default: what the NVMe configuration runs until notebook
    16's first exercise gives it keys made for a limit (the exercise's answer lives in no course module)."""
    swap = {"device": "nvme", "nvme_path": folder}
    return {"offload_optimizer": dict(swap), "offload_param": dict(swap)}


CONFIGURATIONS = {
    "no ZeRO": (0, {}),
    "ZeRO-2 + offload_optimizer": (2, {**SMALL_BUCKETS, "offload_optimizer": {"device": "cpu", "pin_memory": False}}),
    "ZeRO-3 + offload (CPU)": (3, {**STAGE3_SMALL, "offload_optimizer": {"device": "cpu", "pin_memory": False},
                                   "offload_param": {"device": "cpu", "pin_memory": False}}),
    "ZeRO-3 + NVMe": (3, {**STAGE3_SMALL, "stage3_prefetch_bucket_size": 0, **nvme_defaults("<nvme folder>")}),
}


def zero_keys(configuration: str, nvme_folder: str | None = None, largest_param: int = 0,
              nvme: Callable[[str, int], dict] | None = None) -> tuple[int, dict]:
    """(stage, zero_optimization keys) of ``configuration``; the NVMe one swaps into ``nvme_folder`` with the keys
    ``nvme(folder, largest_param)`` writes (a learner's ``nvme_keys``; without one, :func:`nvme_defaults`), without
    prefetching (DeepSpeed 0.19's NVMe prefetch assigns a parameter a second swap buffer here: "already assigned swap
    buffer id")."""
    if configuration not in CONFIGURATIONS:
        raise KeyError(f"No configuration {configuration!r}; the notebook has {list(CONFIGURATIONS)}")
    stage, keys = CONFIGURATIONS[configuration]
    if keys.get("offload_param", {}).get("device") == "nvme":
        if nvme_folder is None:
            raise ValueError(f"{configuration} needs a folder for its swap files (nvme_folder)")
        sections = nvme(nvme_folder, largest_param) if nvme is not None else nvme_defaults(nvme_folder)
        keys = {**STAGE3_SMALL, "stage3_prefetch_bucket_size": 0, **sections}
    return stage, keys


@dataclass
class Limit(Record, name="bigger_limit"):
    """The limit the rank lives under: ``kind`` "cgroup" (CPU), "cuda" (the CUDA allocator) or "none"."""
    kind: str
    cap_bytes: int
    device: str                   # the rank's accelerator: cpu | cuda
    charged_after_join: int = 0   # cgroup: bytes charged to it right after the rank joined (its libraries stay outside)
    fraction: float = 0.0         # cuda: the fraction of the device's memory the allocator may use
    device_total: int = 0         # cuda: the device's memory
    why: str = ""                 # "none": why no limit applied


@dataclass
class Attempt(Record, name="bigger_attempt"):
    """A size the rank is about to build and train (recorded first: the limit may end the rank while it tries)."""
    configuration: str
    size: str
    params: int
    largest_layer: int


@dataclass
class Trial(Record, name="bigger_trial"):
    """A size that trained under the limit: real optimizer steps, and where its model states were."""
    configuration: str
    size: str
    params: int
    largest_layer: int
    dtype: str
    losses: list
    step_seconds: float           # median of the steps after the first
    rung: dict                    # notebook 04's Rung record of this engine (bytes by structure, device and side)
    peak_bytes: int = 0           # the most the limit counted while this size ran (cgroup peak, or CUDA peak)
    limit_bytes: int = 0
    extra: dict = field(default_factory=dict)
