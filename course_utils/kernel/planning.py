"""Memory planning before the first launch: DeepSpeed's estimators, the paper's table, bucket
memory, the OOM ladder as a procedure, and an interactive calculator (notebook 05).

The arithmetic of model states and of offload lives in :mod:`course_utils.common.zero_rules`; this module
asks "will it fit, and what do I try next?".
"""
from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import Any

from course_utils.common import zero_rules
from course_utils.common.zero_rules import GB, per_rank_placement, zero_formula
from course_utils.rank.engine import nvme_offload

PAPER_RANKS = (1, 4, 16, 64, 256, 1024)


def paper_table(num_params: float = 7.5e9, ranks: tuple = PAPER_RANKS, dtype: str = "bf16"):
    """GB per rank of model states for stages 0–3 (columns) and each number of ranks (rows)."""
    import pandas as pd

    return pd.DataFrame({f"stage {s}": [zero_formula(num_params, s, n, dtype)["total"] / GB for n in ranks]
                         for s in range(4)}, index=pd.Index(ranks, name="ranks"))


# ---------------------------------------------------------------- DeepSpeed's estimators

def captured(fn, *args, **kwargs) -> str:
    """What one of DeepSpeed's ``estimate_*`` printers prints (they print instead of returning)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        fn(*args, **kwargs)
    return buf.getvalue()


def estimator_rows(total_params: int, largest_layer_params: int, gpus_per_node: int = 1, nodes: int = 1,
                   label: str = "") -> list[dict]:
    """Every option DeepSpeed's stage-2 and stage-3 estimators consider, as rows of bytes per GPU and
    per CPU (host, per node) — the numbers behind ``estimate_zero{2,3}_model_states_mem_needs_all_*``."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    rows = []
    for offload in (True, False):
        cpu, gpu = estimate_zero2_model_states_mem_needs(total_params, gpus_per_node, nodes, cpu_offload=offload)
        rows.append({"model": label, "params": total_params, "largest_layer_params": largest_layer_params,
                     "gpus": gpus_per_node * nodes, "stage": 2, "offload_optimizer": offload, "offload_param": False,
                     "zero_init": None, "gpu_bytes": gpu, "cpu_bytes": cpu})
    for offload, offload_params in ((True, True), (True, False), (False, False)):
        for zero_init in (True, False):
            cpu, gpu, _ = estimate_zero3_model_states_mem_needs(total_params, largest_layer_params, gpus_per_node,
                                                                nodes, cpu_offload=offload,
                                                                cpu_offload_params=offload_params, zero_init=zero_init)
            rows.append({"model": label, "params": total_params, "largest_layer_params": largest_layer_params,
                         "gpus": gpus_per_node * nodes, "stage": 3, "offload_optimizer": offload,
                         "offload_param": offload_params, "zero_init": zero_init, "gpu_bytes": gpu, "cpu_bytes": cpu})
    return rows


def largest_layer_params(model) -> int:
    """The largest single module's own parameters (what stage 3 must gather at once), as DeepSpeed counts it."""
    return max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())


# ---------------------------------------------------------------- buckets

def overlap_comm_bucket_bytes(reduce_bucket_size: float, allgather_bucket_size: float,
                              bytes_per_element: int = 2, factor: float = 4.5) -> float:
    """The rule of thumb of the Hugging Face transformers DeepSpeed guide (``docs/source/en/deepspeed.md``,
    ZeRO-2): ``overlap_comm`` "uses 4.5x the allgather_bucket_size and reduce_bucket_size values", in
    16-bit elements: 5e8-element buckets → 4.5 × (5e8 + 5e8) × 2 bytes = 9 GB.

    It is folklore, not what DeepSpeed 0.19.8 allocates: notebook 05 measures the buckets of each stage
    (``setup_buckets`` in ``stage_1_and_2.py``, the IPG bucket of ``stage3.py``) beside this rule."""
    return factor * (reduce_bucket_size + allgather_bucket_size) * bytes_per_element


# ---------------------------------------------------------------- the OOM ladder

@dataclass
class Machine:
    gpu_gb: float              # memory of one accelerator
    gpus: int                  # data-parallel ranks
    cpu_gb: float              # host memory of one node
    nvme_gb: float = 0.0       # free fast local disk for ZeRO-Infinity


@dataclass
class Workload:
    params: float              # Ψ
    largest_layer: float       # parameters of the largest layer (stage 3 gathers it whole)
    act_gb_per_sample: float   # activation memory of one sample (per rank)
    ckpt_act_gb_per_sample: float  # the same with gradient checkpointing


def rung_needs(w: Workload, m: Machine, stage: int, offload_opt: bool, offload_param: bool,
                nvme: bool) -> tuple[float, float]:
    """(GB per GPU, GB of host memory per node) for model states, in one accounting for every rung:
    DeepSpeed's estimators' (2Ψ of 16-bit parameters + 18Ψ of 16- and 32-bit gradients, fp32 master weights
    and Adam's moments, the peak inside ``step()``). They have no stage 0 or 1: stage 0 is the stage-2
    estimate with nothing divided (one rank: 20Ψ), stage 1 the same terms with the 16-bit gradients whole
    (4Ψ + 16Ψ/N). The paper's 16Ψ would put stage 0 below the stage-2 estimate on one GPU."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    if stage == 0:
        _, gpu = estimate_zero2_model_states_mem_needs(int(w.params), 1, 1, cpu_offload=False)
        return gpu / GB, 0.0
    if stage == 1:
        return (4 * w.params + 16 * w.params / m.gpus) / GB, 0.0
    if stage == 2:
        cpu, gpu = estimate_zero2_model_states_mem_needs(int(w.params), m.gpus, 1, cpu_offload=offload_opt)
        return gpu / GB, (cpu if offload_opt else 0) / GB
    cpu, gpu, _ = estimate_zero3_model_states_mem_needs(int(w.params), int(w.largest_layer), m.gpus, 1,
                                                        cpu_offload=offload_opt, cpu_offload_params=offload_param,
                                                        zero_init=True)
    if nvme:   # ZeRO-Infinity: the states live on disk; the host keeps the swap buffers of the config
        return gpu / GB, nvme_host_bytes(w.params / m.gpus) * m.gpus / GB
    return gpu / GB, (cpu if offload_opt else 0) / GB


def nvme_host_bytes(partition_numel: float, sub_group_size: float = 1e9, optimizer_buffer_count: int = 4,
                    param_buffer_count: int = 5, param_buffer_size: float = 1e8) -> float:
    """Host bytes one rank keeps for NVMe offload: the optimizer's swap buffers (``buffer_count``
    fp32 buffers of one sub-group, at most ``sub_group_size`` elements) plus the parameter swap
    buffers (``buffer_count`` × ``buffer_size`` 16-bit elements), as in configs/zero3_nvme.json."""
    sub_group = min(partition_numel, sub_group_size)
    return optimizer_buffer_count * sub_group * 4 + param_buffer_count * param_buffer_size * 2


# (name, (ZeRO stage, zero_optimization keys), gradient checkpointing) in the usual order of advice: the rungs of
# notebook 04's ladder (zero_rules.LADDER), after a batch of 1 and checkpointing, and before ZeRO-Infinity
OOM_LADDER = [
    ("batch 1 + gradient accumulation", zero_rules.LADDER["stage 0"], False),
    ("+ gradient checkpointing", zero_rules.LADDER["stage 0"], True),
    ("ZeRO stage 2", zero_rules.LADDER["stage 2"], True),
    ("ZeRO stage 2 + offload_optimizer", zero_rules.LADDER["stage 2 + offload"], True),
    ("ZeRO stage 3", zero_rules.LADDER["stage 3"], True),
    ("ZeRO stage 3 + offload_param + offload_optimizer", zero_rules.LADDER["stage 3 + offload"], True),
    ("ZeRO-Infinity: offload to NVMe", (3, nvme_offload("/local_nvme")), True),
]


def _fits(w: Workload, m: Machine, gpu_gb: float, cpu_gb: float, nvme: bool) -> bool:
    """Whether a rung's accelerator bytes (model states and activations) and host bytes fit ``m``, and, for
    ZeRO-Infinity, its NVMe disk holds the 16 bytes per parameter of the model states."""
    return gpu_gb <= m.gpu_gb and cpu_gb <= m.cpu_gb and (not nvme or w.params * 16 / GB <= m.nvme_gb)


def first_fit(w: Workload, m: Machine, max_batch: int = 1024) -> dict[str, Any]:
    """Walk the OOM ladder; return the first rung whose memory fits, then the largest micro-batch it allows.

    Each rung is tried at micro-batch 1 (with gradient accumulation making up the global batch).
    Returns {"rung", "stage", "offload_optimizer", "offload_param", "nvme", "checkpointing",
    "gpu_gb", "cpu_gb", "micro_batch", "why", "tried"}; ``rung`` is None when nothing fits.
    """
    tried = []
    for name, (stage, zero), ckpt in OOM_LADDER:
        off_opt, off_param, nvme = zero_rules.offload_flags(zero)
        states_gpu, cpu = rung_needs(w, m, stage, off_opt, off_param, nvme)
        act = w.ckpt_act_gb_per_sample if ckpt else w.act_gb_per_sample
        gpu = states_gpu + act
        fits = _fits(w, m, gpu, cpu, nvme)
        tried.append({"rung": name, "gpu_gb": round(gpu, 2), "cpu_gb": round(cpu, 2), "fits": fits})
        if fits:
            batch = 1
            while batch < max_batch and states_gpu + act * (batch + 1) <= m.gpu_gb:
                batch += 1
            why = (f"model states {states_gpu:.1f} GB + activations {act:.2f} GB/sample fit in {m.gpu_gb} GB per GPU"
                   + (f" with {cpu:.1f} GB of host memory (of {m.cpu_gb})" if cpu else "")
                   + f"; the spare room takes a micro-batch of {batch}")
            return {"rung": name, "stage": stage, "offload_optimizer": off_opt, "offload_param": off_param,
                    "nvme": nvme, "checkpointing": ckpt, "gpu_gb": round(gpu, 2), "cpu_gb": round(cpu, 2),
                    "micro_batch": batch, "why": why, "tried": tried}
    return {"rung": None, "why": "nothing on the ladder fits: more GPUs, more host memory or NVMe needed",
            "tried": tried}


def config_rung(parsed: Any) -> tuple[int, bool, bool, bool]:
    """``(stage, offload_optimizer, offload_param, nvme)`` of a config as DeepSpeed parsed it
    (:func:`course_utils.kernel.configs.parse`), in the ladder's terms."""
    zero = parsed.zero_config

    def section(found: Any) -> dict:
        device = getattr(found, "device", None) if found is not None else None
        return {"device": str(getattr(device, "value", device))} if device is not None else {}

    as_keys = {k: s for k in zero_rules.OFFLOAD_MOVES if (s := section(getattr(zero, k, None)))}
    return (int(zero.stage), *zero_rules.offload_flags(as_keys))


def plan_problem(parsed: Any, w: Workload, m: Machine, global_batch: int) -> str | None:
    """What keeps a parsed config from being the plan for ``w`` on ``m`` (the first rung of the ladder that
    fits, in mixed precision, with the largest micro-batch that fits and makes up ``global_batch``), or None.
    It says what the config gives and which requirement it misses, never the configuration wanted."""
    if not (parsed.bfloat16_config.enabled or parsed.float16_config.enabled):
        return ("your config trains in fp32; the estimators and the ladder assume mixed precision (16-bit parameters "
                "and gradients), and fp32 doubles them.")
    if parsed.train_batch_size != global_batch:
        return f"DeepSpeed resolves your config to a global batch of {parsed.train_batch_size} sequences, not {global_batch}."
    rung = config_rung(parsed)
    if rung[0] < 3 and rung[2]:             # offload_param as config_rung read it (zero_rules: a device but "none")
        return (f"your config names offload_param at ZeRO stage {rung[0]}, where DeepSpeed ignores it (parameters are "
                "offloaded only in stage 3; the runner's pre-check says so too): leave out what DeepSpeed will not do.")
    if rung[0] == 1 and rung[1]:
        return ("your config offloads the optimizer at stage 1. DeepSpeed runs it (stages 1 and 2 share one optimizer, "
                "stage_1_and_2.py), but its estimators have no stage 1 and the ladder offloads only from stage 2 on, "
                "where the gradients are divided too: which rung of the ladder is the first that fits?")
    states_gpu, cpu = rung_needs(w, m, *rung)
    micro, act = parsed.train_micro_batch_size_per_gpu, w.ckpt_act_gb_per_sample
    best = first_fit(w, m)
    if rung[3] and not m.nvme_gb:
        return "your config offloads to NVMe, and this machine has no NVMe disk to offload to."
    if rung != (best.get("stage"), best.get("offload_optimizer"), best.get("offload_param"), best.get("nvme")):
        if _fits(w, m, states_gpu + act, cpu, rung[3]):
            return ("your config fits, but it partitions or offloads more than it needs: an earlier rung of the ladder "
                    "fits too, and each rung costs speed.")
        return (f"DeepSpeed's estimators put your config's model states at {states_gpu:.1f} GB per GPU and "
                f"{cpu:.0f} GB of host memory: with the activations of even one sample it does not fit "
                f"{m.gpu_gb} GB GPUs with {m.cpu_gb} GB of host memory.")
    if states_gpu + act * micro > m.gpu_gb:
        return (f"a micro-batch of {micro} needs {states_gpu + act * micro:.1f} GB per GPU with its activations, more "
                f"than {m.gpu_gb} GB.")
    per_rank = global_batch // m.gpus
    usable = [b for b in range(1, per_rank + 1) if per_rank % b == 0 and states_gpu + act * b <= m.gpu_gb]
    if micro < max(usable):
        return (f"a micro-batch of {micro} fits, but a larger one fits too and still makes up the global batch: "
                f"fewer, larger micro-steps are faster.")
    return None


# ---------------------------------------------------------------- the calculator

# The calculator's offload choices, as the zero_optimization keys they stand for: what each moves is
# zero_rules.OFFLOAD_MOVES, the same rule notebook 04's prediction uses (its measurement reads the tensors).
OFFLOAD = {"none": {}, "optimizer": zero_rules.OPTIMIZER_TO_HOST, "optimizer + params": zero_rules.STATES_TO_HOST}


def per_rank_bytes(params_b: float, ranks: int, stage: int, offload: str, dtype: str) -> dict[str, dict[str, float]]:
    """GB per rank of each model state, split into what stays on the accelerator and what is offloaded."""
    placed = per_rank_placement(params_b * 1e9, stage, ranks, dtype, OFFLOAD[offload])
    return {state: {where: b / GB for where, b in split.items()} for state, split in placed.items()}


def draw_per_rank(ax, params_b: float, ranks: int, stage: int, offload: str, dtype: str) -> None:
    parts = per_rank_bytes(params_b, ranks, stage, offload, dtype)
    colors = {"params": "#4C72B0", "grads": "#DD8452", "optimizer": "#55A868"}
    for x, where in enumerate(("device", "host")):
        bottom = 0.0
        for cat, color in colors.items():
            v = parts[cat][where]
            ax.bar(x, v, bottom=bottom, color=color, label=cat if x == 0 else None)
            bottom += v
        ax.text(x, bottom, f"{bottom:.1f} GB", ha="center", va="bottom")
    ax.set_xticks([0, 1], ["accelerator", "host (offloaded)"])
    ax.set_ylabel("GB per rank")
    ax.set_title(f"{params_b:g} B params, {ranks} ranks, stage {stage}, offload {offload}, {dtype}")
    ax.legend()


def calculator():
    """An ipywidgets calculator of per-rank model-state bytes; it opens on the ZeRO paper's case (7.5 B
    parameters, 64 ranks, stage 3, bf16). Returns (widget, update): call ``update()`` once so that a
    non-interactive run (papermill) also shows a figure.

    The figure is a display with an id that each slider move replaces (``DisplayHandle.update``), not an
    ``ipywidgets.Output``: a headless executor such as nbclient answers every write into an Output widget
    with a comm message on the shell channel, and those can strand the cell's execute_reply (the cell
    then never finishes). A display handle needs nothing back from the frontend.
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt
    from IPython.display import display

    controls = {
        # a number box, not a log slider: a FloatLogSlider snaps 7.5 to its grid (10**0.9 = 7.94)
        "params_b": w.BoundedFloatText(value=7.5, min=0.001, max=10_000, step=0.5, description="params (B)"),
        "ranks": w.IntSlider(value=64, min=1, max=1024, description="ranks"),
        "stage": w.IntSlider(value=3, min=0, max=3, description="ZeRO stage"),
        "offload": w.Dropdown(options=list(OFFLOAD), value="none", description="offload"),
        "dtype": w.Dropdown(options=["bf16", "fp16", "fp32"], value="bf16", description="dtype"),
    }
    handle = None

    def figure():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        draw_per_rank(ax, **{k: c.value for k, c in controls.items()})
        plt.close(fig)            # shown through the display handle only, not again at the end of the cell
        return fig

    def update(**_: Any) -> None:
        nonlocal handle
        if handle is None:
            handle = display(figure(), display_id=True)
        else:
            handle.update(figure())

    for c in controls.values():
        c.observe(lambda change: update(), names="value")
    return w.VBox(list(controls.values())), update
