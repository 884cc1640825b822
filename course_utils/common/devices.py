"""Which device a process computes on, decided in one place, for the notebook's kernel and for every rank.

A GPU machine runs two kinds of ranks. A launch whose lesson needs more ranks than the machine has GPUs runs on CPU
ranks over gloo (``kernel.hardware.placement``); every other launch runs one rank per GPU. A CPU rank is told so by
``DS_ACCELERATOR=cpu``, the variable DeepSpeed itself reads to choose its accelerator, and :func:`is_cpu_rank` is
the only question the course asks about it. The answer cannot come from ``torch.cuda.is_available()``: DeepSpeed's
launcher sets ``CUDA_VISIBLE_DEVICES`` for every rank it starts, whatever the accelerator (``launcher/launch.py``:
``set_visible_devices_envs``, ``--num_gpus 2`` → ``0,1``), so a CPU rank on a GPU machine sees the GPU unless
the rank hook hides it again (``rank/hook/sitecustomize.py``).

**A described machine.** ``COURSE_MACHINE`` (JSON, e.g. ``{"gpus": 1, "name": "NVIDIA H100 80GB HBM3", "cores": 16}``)
tells the course it is on that machine: every decision that differs on a GPU machine (placement, which ops build
where, the environment of CPU ranks, the hardware line) is taken for it, while the ranks, having no GPU to run on,
compute on the CPU. In those ranks ``torch.cuda`` answers as that machine's would, from ``CUDA_VISIBLE_DEVICES``
(``COURSE_SIMULATED_GPUS``, :func:`visible_gpus`), so a rank that would see a GPU there sees one here too. The
tests describe 1-, 2- and 8-GPU machines this way; nobody else needs to.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

MACHINE_ENV = "COURSE_MACHINE"
SIMULATED_GPUS_ENV = "COURSE_SIMULATED_GPUS"
ACCELERATOR_ENV = "DS_ACCELERATOR"      # DeepSpeed's own choice of accelerator (deepspeed/accelerator/real_accelerator.py)


def described(environ: Mapping[str, str] | None = None) -> dict | None:
    """The machine ``COURSE_MACHINE`` describes (``gpus``, and optionally ``name``, ``cores``), or None."""
    text = (os.environ if environ is None else environ).get(MACHINE_ENV)
    if not text:
        return None
    try:
        machine = json.loads(text)
        int(machine["gpus"])
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{MACHINE_ENV}={text!r} describes no machine ({e}): give JSON such as "
                         '{"gpus": 1, "name": "NVIDIA H100 80GB HBM3", "cores": 16}') from None
    return machine


def device(environ: Mapping[str, str] | None = None) -> str:
    """``"cuda"`` or ``"cpu"``: what this process's DeepSpeed computes on. The described machine's accelerator in a
    kernel told it is on one (its ranks are not told: they compute on the CPU); else ``DS_ACCELERATOR`` when set (a
    CPU rank, or a CPU machine's kernel); else a GPU when an NVIDIA driver is loaded and torch sees a device
    (DeepSpeed's own probe; without a driver torch is not even imported)."""
    env = os.environ if environ is None else environ
    machine = described(env)
    if machine is not None:
        return "cuda" if int(machine["gpus"]) > 0 else "cpu"
    chosen = env.get(ACCELERATOR_ENV)
    if chosen:
        return "cpu" if chosen == "cpu" else "cuda"
    if not Path("/proc/driver/nvidia").exists():
        return "cpu"
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def is_cpu_rank(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this rank computes on the CPU, on a CPU machine or as a CPU rank of a GPU machine. Asked by the rank
    hook (hide the GPU, prepare the Trainer's state) and by ``rank.trainer``; nothing else decides it."""
    return device(environ) == "cpu"


def visible_gpus(gpus: int, visible: str | None) -> int:
    """How many of a machine's ``gpus`` a process sees under ``CUDA_VISIBLE_DEVICES=visible``, as CUDA reads it:
    unset, all; empty, none; otherwise the listed indices up to the first that is not a device of the machine."""
    if visible is None:
        return gpus
    seen: list[int] = []
    for item in visible.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) >= gpus or int(item) in seen:
            break
        seen.append(int(item))
    return len(seen)
