"""Notebook 00: which devices DeepSpeed's launcher gives the ranks, and what it does with ``CUDA_VISIBLE_DEVICES``.

The runner (``deepspeed/launcher/runner.py``, ``main``) decides which device ids of each host the job uses; the
per-node launcher (``deepspeed/launcher/launch.py``, ``main``) then gives every rank of a node the same
``CUDA_VISIBLE_DEVICES`` (those ids, joined by commas) and its own ``LOCAL_RANK``, so that rank ``i`` of the node
computes on ``cuda:i``, the ``i``-th of those ids. :func:`runner_devices` takes the runner's decision with DeepSpeed's
own functions; the notebook checks it against two real runs of the ``deepspeed`` command on this machine before it
applies it to a 4-GPU node.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

VISIBLE = "CUDA_VISIBLE_DEVICES"


def runner_devices(pool: dict[str, int], visible: str = "", include: str = "", exclude: str = "", num_gpus: int = -1,
                   num_nodes: int = -1) -> dict[str, list[int]]:
    """The device ids per host that DeepSpeed's runner hands its launchers, for a launch without a hostfile on a
    machine whose devices it counts as ``pool`` (``{"localhost": n}``), with ``CUDA_VISIBLE_DEVICES=visible`` in its
    environment and these flags (-1: not given). Raises DeepSpeed's ``ValueError`` where the runner refuses.

    The order of ``main()`` in ``deepspeed/launcher/runner.py``: a set ``CUDA_VISIBLE_DEVICES`` becomes
    ``--include=localhost:<it>`` unless --include/--exclude/--num_gpus/--num_nodes>1 is given (then it is ignored);
    --num_gpus/--num_nodes with --include/--exclude is refused; the include/exclude filter checks every id against
    the pool (``parse_inclusion_exclusion``), and ``apply_num_nodes_and_gpus`` then keeps ids ``0..num_gpus-1``
    per host, whatever the pool holds."""
    from deepspeed.launcher import runner

    if visible and not (include or exclude or num_nodes > 1 or num_gpus > 0):
        include = f"localhost:{visible}"
    if (num_nodes >= 0 or num_gpus >= 0) and (include or exclude):
        raise ValueError("Cannot specify num_nodes/gpus with include/exclude")
    active = runner.parse_inclusion_exclusion(pool, include, exclude)
    return {host: list(ids) for host, ids in runner.apply_num_nodes_and_gpus(active, num_nodes, num_gpus).items()}


@dataclass
class Case:
    """One way of starting ``deepspeed`` on a node: the command line and what the runner reads from it."""
    command: str
    visible: str = ""
    include: str = ""
    exclude: str = ""
    num_gpus: int = -1


# On a node with 4 GPUs: the usual ways of choosing them, and the one that does not work.
FOUR_GPU_CASES = (
    Case("deepspeed --num_gpus 2 train.py", num_gpus=2),
    Case("CUDA_VISIBLE_DEVICES=2,3 deepspeed --num_gpus 2 train.py", visible="2,3", num_gpus=2),
    Case("CUDA_VISIBLE_DEVICES=2,3 deepspeed train.py", visible="2,3"),
    Case("deepspeed --include localhost:1,3 train.py", include="localhost:1,3"),
    Case("deepspeed --exclude localhost:0 train.py", exclude="localhost:0"),
    Case("deepspeed --num_gpus 2 --include localhost:1,3 train.py", include="localhost:1,3", num_gpus=2),
)


def case_table(cases: tuple[Case, ...], gpus: int):
    """One row per case on a node whose runner counts ``gpus`` devices: the ids it uses, what every rank gets in
    ``CUDA_VISIBLE_DEVICES``, and the physical GPU each rank computes on (``cuda:<LOCAL_RANK>`` inside that list);
    or the runner's refusal."""
    import pandas as pd

    rows = []
    for case in cases:
        try:
            ids = runner_devices({"localhost": gpus}, case.visible, case.include, case.exclude, case.num_gpus)["localhost"]
        except ValueError as refused:
            rows.append({"command": case.command, "ranks": 0, VISIBLE + " of every rank": "",
                         "GPU of each rank (LOCAL_RANK → id)": f"refused: ValueError: {refused}"})
            continue
        rows.append({"command": case.command, "ranks": len(ids), VISIBLE + " of every rank": ",".join(map(str, ids)),
                     "GPU of each rank (LOCAL_RANK → id)": ", ".join(f"{i} → {g}" for i, g in enumerate(ids))})
    return pd.DataFrame(rows).set_index("command")


def runner_lines(log: str) -> list[str]:
    """The lines of a launch's log where DeepSpeed's runner and launcher speak about the visible devices."""
    lines = [re.sub(r"^\[launcher\] ", "", line) for line in log.splitlines()]
    return [line for line in lines if "Detected VISIBLE_DEVICES" in line or f"Setting {VISIBLE}=" in line
            or re.match(r"\w*Error: ", line)]


@dataclass
class Refusal:
    """The ``deepspeed`` command run without --num_gpus/--include/--exclude (see :func:`without_flags`)."""
    command: str
    lines: list             # the runner's lines about the devices (:func:`runner_lines`)
    error: str              # the exception's last line ("" when it started the job)
    output: str


def without_flags(script: str, visible: str, timeout: float = 120) -> Refusal:
    """Run ``CUDA_VISIBLE_DEVICES=<visible> deepspeed scripts/<script>`` with no device flag through
    :func:`course_utils.kernel.launch.command`: the runner turns the variable into ``--include``. With an id the
    runner does not count, it refuses before it starts any process."""
    from course_utils.kernel.launch import CommandError, command

    args = ["deepspeed", f"scripts/{script}"]
    try:
        out, error = command(args, timeout=timeout, env={VISIBLE: visible}), ""
    except CommandError as failed:
        out = failed.output
        error = next((line for line in reversed(out.splitlines()) if re.match(r"\w+Error: ", line)), "")
    return Refusal(f"{VISIBLE}={visible} " + " ".join(args), runner_lines(out), error, out)


def counted_devices() -> int:
    """How many devices DeepSpeed's runner counts on this machine (``get_accelerator().device_count()``): the GPUs,
    or on the CPU accelerator one per NUMA node (``LOCAL_SIZE`` when it is set)."""
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_count()
