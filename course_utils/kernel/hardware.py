"""What this machine can run: accelerator, communication backend, default number of ranks.

The course runs unchanged on a 2-core laptop (CPU ranks over gloo) and on GPU machines (one rank
per GPU over nccl); every default that depends on the machine is decided here, once.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

from course_utils.common import paths

CPU_DEFAULT_PROCS = 2


@dataclass(frozen=True)
class Hardware:
    accelerator: str            # "cpu" or "cuda" (DeepSpeed's accelerator name)
    gpus: int                   # CUDA devices visible to torch
    gpu_names: tuple = field(default_factory=tuple)
    cpu_cores: int = 1
    backend: str = "gloo"       # what deepspeed.init_distributed() will pick
    bf16: bool = True           # bf16 supported by the accelerator
    fp16: bool = True

    @property
    def default_procs(self) -> int:
        """Ranks per launch: one per GPU, else two CPU ranks."""
        return self.gpus if self.gpus else CPU_DEFAULT_PROCS

    @property
    def is_gpu(self) -> bool:
        return self.gpus > 0

    def line(self) -> str:
        """One sentence for the top of a notebook."""
        if self.is_gpu:
            return (f"This machine: {self.gpus} × {self.gpu_names[0]} → {self.default_procs} ranks over "
                    f"{self.backend}; CUDA memory is measured alongside the tensor accounting.")
        return (f"This machine: no GPU, {self.cpu_cores} CPU cores → {self.default_procs} CPU ranks over "
                f"{self.backend}. Everything runs for real, only slower; on a GPU machine the same "
                f"cells use nccl with one rank per GPU and also report CUDA memory.")


@dataclass(frozen=True)
class Placement:
    """Where one launch's ranks run: how many per node, and whether on CPU although GPUs are here."""
    procs: int
    cpu_on_gpu_machine: bool = False
    note: str = ""              # one sentence for the cell when the launch does not use the GPUs


def placement(hw: Hardware, procs: int | None = None, min_ranks: int | None = None) -> Placement:
    """The ranks of a launch on ``hw``: ``procs`` if given (else one per GPU, or 2 CPU ranks), raised to the
    ``min_ranks`` its lesson needs (partitioning, sharding or a world-size change mean nothing on one rank).
    A GPU machine with fewer GPUs than that runs the launch on CPU ranks over gloo (nccl needs one GPU
    per rank) and says so; launches about one device (offload, fp16 loss scaling, CUDA memory) give no
    ``min_ranks`` and keep the GPU."""
    want = procs if procs is not None else hw.default_procs
    if min_ranks is not None:
        want = max(want, min_ranks)
    if hw.is_gpu and want > hw.gpus:
        return Placement(want, True, f"This lesson needs {want} ranks and this machine has {hw.gpus} GPU"
                                     f"{'s' if hw.gpus != 1 else ''}: this launch runs {want} CPU ranks over gloo "
                                     f"(nccl needs one GPU per rank).")
    return Placement(want)


def cpu_ranks_env(world_size: int, gpu_machine: bool = False) -> dict[str, str]:
    """What makes a launch's ranks CPU ranks over gloo: DeepSpeed's CPU accelerator (no probing, no warning), the
    cores shared instead of every rank spinning on all of them, and on a GPU machine no GPU visible to them."""
    env = {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // max(1, world_size)))}
    if gpu_machine:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


@functools.lru_cache(maxsize=None)
def detect() -> Hardware:
    """Ask torch and DeepSpeed's accelerator what is here (cached: it imports deepspeed once).

    It also points this process (and, through the environment, every launch from it) at the course's
    JIT-built DeepSpeed ops (:func:`paths.use_course_torch_extensions`), before DeepSpeed is imported.
    """
    paths.use_course_torch_extensions()
    import torch

    if not torch.cuda.is_available():      # skip DeepSpeed's probing (and its warning) on a CPU machine
        os.environ.setdefault("DS_ACCELERATOR", cpu_ranks_env(1)["DS_ACCELERATOR"])
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = tuple(torch.cuda.get_device_name(i) for i in range(gpus))
    return Hardware(
        accelerator=acc.device_name(),
        gpus=gpus,
        gpu_names=names,
        cpu_cores=os.cpu_count() or 1,
        backend=acc.communication_backend_name(),
        bf16=bool(acc.is_bf16_supported()),
        fp16=bool(acc.is_fp16_supported()),
    )


def needs_gpu(what: str) -> bool:
    """True when a GPU is here; otherwise print why ``what`` is skipped on this machine."""
    if detect().is_gpu:
        return True
    print(f"⏭  {what}: needs a CUDA GPU, and this machine has none. The explanation above stands; "
          f"run this notebook on a GPU machine to see it measured.")
    return False
