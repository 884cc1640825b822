"""Notebook 16 in the kernel: launch one configuration under a memory limit, read what its rank recorded (also
when the limit ended it), and put the configurations side by side with DeepSpeed's estimates.

:func:`try_sizes` is the one launch: it makes the memory cgroup (``launch.memcap``; the rank decides whether to join
it or, on a GPU, to cap the CUDA allocator instead), gives the NVMe configuration a swap folder under ``build/``,
launches ``scripts/16_bigger_than_your_device.py`` on one rank, and removes the folder whatever happened. The
runner removes the cgroup and the ``/dev/shm`` buffers itself, also when the kernel's out-of-memory killer ended
the rank.
"""
from __future__ import annotations

import dataclasses
import functools

import re
import shutil
from dataclasses import dataclass, field

from course_utils.common import paths
from course_utils.common.record import read_as
from course_utils.common.records.bigger import CONFIGURATIONS, SIZES, Attempt, Limit, Trial
from course_utils.common.records.offload import Rung
from course_utils.common.records.scale import MachineFigures
from course_utils.kernel.launch.options import launches

MiB = 2**20
PROCS = 1           # one rank, one device
TRAINED, OUT_OF_MEMORY, FAILED = "trained", "out of memory", "failed"


@dataclass
class Outcome:
    """What one launch of one configuration did: each size it attempted, and how the launch ended."""
    configuration: str
    cap_mb: int
    limit: Limit | None
    attempts: list[Attempt]
    trials: list[Trial]
    error: str | None = None              # the runner's message when the launch failed
    skipped: str | None = None            # why nothing was launched (no memory cgroup on this machine)
    seconds: float = 0.0
    statuses: dict = field(default_factory=dict)    # size → trained | out of memory | failed
    cgroup: str | None = None             # the memory cgroup the launch made (removed after it), on a CPU
    figures: MachineFigures | None = None    # this machine's rates, when the launch measured them first

    @property
    def largest(self) -> Trial | None:
        """The largest size that trained (sizes are tried in ascending order)."""
        return self.trials[-1] if self.trials else None


def nvme_folder() -> "paths.Path":
    """Where the NVMe configuration's swap files go (a folder under build/, removed after every launch)."""
    return paths.build_dir() / "nvme" / "16_bigger"


def probe_folder() -> "paths.Path":
    """Where a launch that measures this machine writes the disk's probe file (removed after)."""
    return paths.build_dir() / "nvme" / "16_machine"


def killed_for_memory(message: str) -> bool:
    """The runner's message says the rank ran out of memory: killed by SIGKILL (CPU) or torch's OutOfMemoryError (GPU)."""
    return bool(re.search(r"killed by SIGKILL|OutOfMemoryError|CUDA out of memory", message))


def statuses(attempts: list[Attempt], trials: list[Trial], error: str | None) -> dict[str, str]:
    """size → outcome: trained; the one attempted last without a trial, out of memory (or failed, for any other
    error)."""
    done = {t.size for t in trials}
    out = {}
    for a in attempts:
        if a.size in done:
            out[a.size] = TRAINED
        else:
            out[a.size] = OUT_OF_MEMORY if error and killed_for_memory(error) else FAILED
    return out


@launches(procs=PROCS)
def try_sizes(configuration: str, sizes: list[str], cap_mb: int, steps: int = 4, timeout: int = 600,
              quiet: bool = True, nvme_keys_file: str | None = None, measure_machine: bool = False) -> Outcome:
    """Launch ``configuration`` on one rank under a limit of ``cap_mb`` MiB, training ``sizes`` in this order until
    one does not fit (the NVMe keys from ``nvme_keys_file``, a learner's ``nvme_keys``, when given). With
    ``measure_machine`` the rank first measures this machine's rates, outside the limit (``Outcome.figures``). A limit
    the machine cannot give (no memory cgroup, not root) skips the launch with the reason."""
    from course_utils.kernel import hardware, launch
    from course_utils.kernel.launch.memcap import MemoryCapUnavailable, memory_cap

    if configuration not in CONFIGURATIONS:
        raise KeyError(f"No configuration {configuration!r}; choose one of {list(CONFIGURATIONS)}")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise KeyError(f"No size {unknown[0]!r}; the sizes are {list(SIZES)}")
    folder = nvme_folder()
    args = ["--configuration", configuration, "--sizes", *sizes, "--cap_mb", cap_mb, "--steps", steps,
            "--nvme_dir", folder] + (["--nvme_keys_file", nvme_keys_file] if nvme_keys_file else [])
    if measure_machine:
        args += ["--machine_swap_dir", probe_folder()]
    shutil.rmtree(folder, ignore_errors=True)
    records, error, seconds, cgroup = [], None, 0.0, None
    try:
        with memory_cap(cap_mb) as procs:
            cgroup = procs.parent.name
            records, error, seconds = _launch(args + ["--cgroup_procs", procs], timeout, quiet)
    except MemoryCapUnavailable as err:
        if not hardware.detect().is_gpu:        # a GPU rank caps its CUDA allocator and needs no cgroup
            return Outcome(configuration, cap_mb, None, [], [], skipped=str(err))
        records, error, seconds = _launch(args, timeout, quiet)
    finally:
        shutil.rmtree(folder, ignore_errors=True)     # swap files left by a rank the limit ended
        if measure_machine:
            shutil.rmtree(probe_folder(), ignore_errors=True)
    attempts, trials = read_as(records, Attempt), read_as(records, Trial)
    limits, figures = read_as(records, Limit), read_as(records, MachineFigures)
    return Outcome(configuration, cap_mb, limits[0] if limits else None, attempts, trials, error=error,
                   seconds=seconds, statuses=statuses(attempts, trials, error), cgroup=cgroup,
                   figures=figures[0] if figures else None)


def only(outcome: Outcome, size: str) -> Outcome:
    """``outcome`` as if its launch had tried ``size`` alone (its attempt, its trial, its status)."""
    return dataclasses.replace(outcome, attempts=[a for a in outcome.attempts if a.size == size],
                               trials=[t for t in outcome.trials if t.size == size],
                               statuses={s: v for s, v in outcome.statuses.items() if s == size})


def _launch(args: list, timeout: int, quiet: bool,
            script: str = "16_bigger_than_your_device.py") -> tuple[list[dict], str | None, float]:
    from course_utils.kernel import launch

    try:
        result = launch.deepspeed(script, *args, procs=PROCS, timeout=timeout, quiet=quiet)
        return result.records, None, result.seconds
    except launch.LaunchError as err:
        return err.result.records, str(err), err.result.seconds


def rung(trial: Trial) -> Rung:
    """Notebook 04's record of the trial's engine."""
    return trial.rung if isinstance(trial.rung, Rung) else Rung(**trial.rung)


def summary(outcome: Outcome) -> str:
    """One line per size of a launch, and the runner's message when the limit ended it."""
    if outcome.skipped:
        return f"{outcome.configuration}: skipped — {outcome.skipped}"
    lines = [f"{outcome.configuration}, limit {outcome.cap_mb} MiB ({outcome.limit.kind if outcome.limit else '?'}):"]
    for a in outcome.attempts:
        trial = next((t for t in outcome.trials if t.size == a.size), None)
        states = 16 * a.params / MiB
        if trial is None:
            lines.append(f"  {a.size:>5} ({a.params / 1e6:4.1f} M parameters, 16 B/parameter = {states:6.0f} MiB): "
                         f"{outcome.statuses[a.size]}")
        else:
            lines.append(f"  {a.size:>5} ({a.params / 1e6:4.1f} M parameters, 16 B/parameter = {states:6.0f} MiB): "
                         f"trained, loss {trial.losses[0]:.2f} → {trial.losses[-1]:.2f}, {trial.step_seconds:.2f} s/step, "
                         f"peak {trial.peak_bytes / MiB:.0f} MiB of {outcome.cap_mb}"
                         + (f" (still charged from earlier sizes: {trial.extra['held_before'] / MiB:.0f} MiB)"
                            if trial.extra.get("held_before", 0) > MiB else ""))
    return "\n".join(lines)


def estimate(configuration: str, params: int, largest_layer: int) -> dict[str, float | None]:
    """DeepSpeed's estimate for ``configuration`` at this size on one rank (notebook 05's reading of its estimators:
    ``course_utils.kernel.planning.estimator_rows``), bytes on the device and on the host. The estimators have no
    stage 0 (notebook 05 takes stage 2 with nothing divided, one rank) and no NVMe option (stage 3 with
    ``offload_param``'s device column is what stays on the device; the host column is what NVMe takes away)."""
    from course_utils.kernel import planning

    stage, keys = CONFIGURATIONS[configuration]
    offload_optimizer = "offload_optimizer" in keys
    offload_param = "offload_param" in keys
    nvme = keys.get("offload_param", {}).get("device") == "nvme"
    for row in planning.estimator_rows(params, largest_layer, 1):
        same = (row["stage"] == max(stage, 2) and row["offload_optimizer"] == offload_optimizer
                and row["offload_param"] == offload_param and row["zero_init"] in (None, True))
        if same:
            return {"device": row["gpu_bytes"], "host": None if nvme else row["cpu_bytes"]}
    raise LookupError(f"no estimator row for {configuration}")


def table(outcomes: list[Outcome], device_is_host: bool):
    """One row per configuration: the sizes tried and how each ended, the largest that trained, its step time, where
    its model states were (notebook 04's sides: accelerator, host, NVMe files), the peak under the limit, and
    DeepSpeed's estimate for the same size. ``device_is_host`` (a CPU rank): both estimates count against the limit."""
    import pandas as pd

    rows = []
    for o in outcomes:
        best = o.largest
        row = {"configuration": o.configuration, "limit MiB": o.cap_mb,
               "sizes tried": ", ".join(f"{s} {'✓' if v == TRAINED else '✗ ' + v}" for s, v in o.statuses.items())
               or (o.skipped and "skipped")}
        if best is not None:
            r = rung(best)
            est = estimate(o.configuration, best.params, best.largest_layer)
            in_limit = est["device"] + (est["host"] or 0 if device_is_host else 0)
            row.update({"largest trained": best.size, "16 B/param MiB": 16 * best.params / MiB,
                        "states / limit": 16 * best.params / (o.cap_mb * MiB), "s/step": best.step_seconds,
                        "accelerator side MiB": r.accelerator_side_bytes / MiB, "host side MiB": r.host_side_bytes / MiB,
                        "NVMe MiB": r.nvme_bytes / MiB, "peak MiB": best.peak_bytes / MiB,
                        "estimate: device MiB": est["device"] / MiB,
                        "estimate: host MiB": est["host"] / MiB if est["host"] is not None else None,
                        "estimate in the limit MiB": in_limit / MiB})
        rows.append(row)
    return pd.DataFrame(rows).set_index("configuration").round(2)


def plot(outcomes: list[Outcome]):
    """For each configuration, its largest trained size's model states by where they were (stacked) and the peak the
    limit counted, against the limit."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    names = [o.configuration for o in outcomes]
    for i, o in enumerate(outcomes):
        best = o.largest
        if best is None:
            continue
        r = rung(best)
        bottom = 0.0
        for label, value, colour in (("accelerator side", r.accelerator_side_bytes, "tab:blue"),
                                     ("host side", r.host_side_bytes, "tab:orange"),
                                     ("NVMe files", r.nvme_bytes, "tab:green")):
            ax.bar(i, value / MiB, bottom=bottom, color=colour, label=label if i == 0 else None, width=0.5)
            bottom += value / MiB
        ax.plot([i - 0.3, i + 0.3], [best.peak_bytes / MiB] * 2, color="black", lw=2,
                label="peak under the limit" if i == 0 else None)
        ax.text(i, bottom, f" {best.size}", ha="center", va="bottom", fontsize=8)
    cap = outcomes[0].cap_mb
    ax.axhline(cap, color="red", ls="--", label=f"the limit ({cap} MiB)")
    ax.set_xticks(range(len(names)), [n.replace(" + ", "\n+ ") for n in names], fontsize=8)
    ax.set_ylabel("MiB")
    ax.set_title("Largest model trained under the limit: where its model states were")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


CPU_CAP_MB = 352      # the limit on a CPU: small enough that the sizes train in seconds on two cores
# How the sizes of each configuration stand to the limit (16 bytes of model states per parameter ÷ the limit): no ZeRO
# grows from one that fits with room to spare to one just past the limit; offload on a GPU on to twice and three times
# the limit; NVMe trains one twice the limit. On a CPU these pick 11 M and 25 M, 48 M and 76 M, and 48 M.
FITS_WITH_ROOM, JUST_PAST, TWICE, THRICE = 0.5, 1.05, 2.0, 3.0


def default_cap_mb(hw) -> int:
    """The limit of this machine's launches: :data:`CPU_CAP_MB` without a GPU; with one, the share of its memory the
    course's sized lessons use (``hardware.SIZED_SHARE``), so that the sizes keep the GPU busy."""
    from course_utils.kernel.hardware import SIZED_SHARE

    return int(hw.gpu_memory_bytes * SIZED_SHARE / MiB) if hw.is_gpu else CPU_CAP_MB


def sizes_for(cap_mb: int, is_gpu: bool) -> tuple[list[str], list[str], list[str]]:
    """(no ZeRO, offload, NVMe) sizes for a limit of ``cap_mb`` MiB, from the family of the machine (``CPU_SIZES`` or
    ``GPU_SIZES``), by how their model states stand to the limit (:data:`FITS_WITH_ROOM` …). On a CPU offload keeps
    the sizes of no ZeRO: offloaded states stay in the same memory there."""
    from course_utils.common.records.bigger import CPU_SIZES, GPU_SIZES

    family = GPU_SIZES if is_gpu else CPU_SIZES
    ratio = {s: 16 * parameters(s) / (cap_mb * MiB) for s in family}
    below = [s for s in family if ratio[s] <= FITS_WITH_ROOM]
    past = {x: next((s for s in family if ratio[s] >= x), None) for x in (JUST_PAST, TWICE, THRICE)}
    if not below or None in past.values():
        raise ValueError(f"a limit of {cap_mb} MiB is outside the sizes of this machine ({', '.join(family)}): the "
                         f"smallest needs {16 * parameters(next(iter(family))) / MiB:.0f} MiB of model states; choose "
                         f"a limit between about {32 * parameters(next(iter(family))) / MiB:.0f} and "
                         f"{16 * parameters(list(family)[-1]) / (THRICE * MiB):.0f} MiB")
    plain = [below[-1], past[JUST_PAST]]
    offload = plain + [past[TWICE], past[THRICE]] if is_gpu else plain
    return plain, offload, [past[TWICE]]


@functools.cache
def parameters(size: str) -> int:
    """The parameters of ``size``, counted on a model built on the meta device (no memory)."""
    import torch
    from transformers import GPT2LMHeadModel

    from course_utils.rank.bigger import gpt2_config, sizes_of

    with torch.device("meta"):
        return sizes_of(GPT2LMHeadModel(gpt2_config(size)))[0]


PLACEMENT_TOLERANCE = 0.10    # of the size's model states (16 bytes a parameter), on each side
PLACES = {"accelerator_side_mib": "accelerator side", "host_side_mib": "host side"}


def placement_problem(mine, outcome: Outcome | None, size: str) -> str | None:
    """What is wrong with a prediction of where ``size``'s model states are after a backward (MiB on each of notebook
    04's two sides) against what ``outcome``'s launch measured, in words that do not give the measured MiB; None when
    both sides are within :data:`PLACEMENT_TOLERANCE` of the size's 16 bytes a parameter."""
    if not isinstance(mine, dict) or set(PLACES) - set(mine):
        return f"return a dict with the keys {', '.join(PLACES)}."
    if outcome is None or outcome.skipped:
        return f"the launch could not run on this machine ({outcome.skipped if outcome else 'none'})."
    trial = next((t for t in outcome.trials if t.size == size), None)
    if trial is None:
        return f"the launch did not train {size}: read its message above."
    placed = rung(trial)
    room = PLACEMENT_TOLERANCE * 16 * trial.params / MiB
    said = []
    for key, measured in (("accelerator_side_mib", placed.accelerator_side_bytes),
                          ("host_side_mib", placed.host_side_bytes)):
        off = float(mine[key]) - measured / MiB
        if abs(off) > room:
            said.append(f"on the {PLACES[key]} you predicted {'more' if off > 0 else 'less'} than DeepSpeed placed there, "
                        f"by more than {PLACEMENT_TOLERANCE:.0%} of the size's model states")
    return "; ".join(said) + "." if said else None


def nvme_problem(outcome: Outcome) -> str | None:
    """What is wrong with the NVMe launch run with a learner's ``nvme_keys``, without naming the keys; None when its
    largest size trained with its model states in the swap files and at most a quarter of them in memory."""
    if outcome.skipped:
        return f"the launch could not run on this machine ({outcome.skipped})."
    if FAILED in outcome.statuses.values() or (outcome.error and not outcome.trials):
        if not killed_for_memory(outcome.error or ""):
            return "DeepSpeed stopped the launch before the limit did: read its message above."
    if OUT_OF_MEMORY in outcome.statuses.values():
        return "the limit ended the launch: your configuration keeps more in memory than the limit holds."
    best = outcome.largest
    if best is None:
        return "no size trained."
    placed = rung(best)
    if placed.nvme_bytes < 16 * best.params:
        return "the swap files hold less than the parameters and the optimizer states: something stayed in memory."
    if placed.host_side_bytes + placed.accelerator_side_bytes > 6 * best.params:
        return "more than the gradients stayed in memory beside the swap files."
    return None
