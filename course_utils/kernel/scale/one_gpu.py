"""Notebook 16 at real scale: fine-tuning an 8 B model on one 24 GB GPU, projected from counts (the model built on
the ``meta`` device, DeepSpeed's own estimators for what each configuration keeps where, this machine's measured
DeepSpeedCPUAdam), and the exercise that asks a learner to project a step themselves."""
from __future__ import annotations

import inspect

from course_utils.kernel.scale import models, project, specs

LORA_RANK = 16
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")     # attention projections, the usual LoRA targets
GB = 1e9


def lora_params(name: str, rank: int = LORA_RANK, targets: tuple = LORA_TARGETS) -> int:
    """Trainable parameters LoRA adds: r·(in + out) for every targeted Linear of the model (read on the meta device)."""
    import torch

    model = models.build(name)
    return sum(rank * (m.in_features + m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in targets)


def eight_b_on_24gb(cpu_adam_s_per_param_core: float, gpu_name: str = "RTX 4090 24 GB",
                    model: str = "Llama-3-8B shape", tokens: int = 4096, host_cores: int = project.HOST_CORES_PER_GPU):
    """Full fine-tuning with notebook 16's configurations (without ZeRO, ZeRO-Offload to CPU and NVMe) against LoRA on
    a frozen bf16 base, on one GPU: what each keeps on the GPU and on the host, whether it fits, and a step projected
    on that GPU. Activations and the recompute are notebook 11's (:func:`.compute.kept_per_token` of a checkpointed
    bf16 model, :func:`.compute.blocks_share` with transformers' early stop); what DeepSpeed keeps on the GPU is its
    estimators' reading for each configuration (:func:`course_utils.kernel.views.bigger.estimate`). Returns (rows,
    projections)."""
    from course_utils.common.records.bigger import CONFIGURATIONS
    from course_utils.common.zero_rules import offload_flags
    from course_utils.kernel.scale import compute
    from course_utils.kernel.views.bigger import estimate

    size, gpu, dec = models.size(model), specs.gpu(gpu_name), compute.real(model)
    acts = compute.kept_per_token(dec, compute.BF16, checkpointed=True)["total"] * tokens
    recompute = compute.blocks_share(dec, size.tokens_per_sample, early_stop=True)
    lora = lora_params(model)
    cases = {name: dict(zip(("offload_optimizer", "offload_param", "nvme"), offload_flags(keys)), stage=stage)
             for name, (stage, keys) in CONFIGURATIONS.items()}
    cases[f"LoRA r={LORA_RANK}, frozen bf16 base"] = dict(stage=0, trainable=lora, frozen_share=1.0)
    rows, projections = [], []
    for name, kw in cases.items():
        p = project.step(size, gpu, 1, tokens_per_gpu=tokens, recompute=recompute, host_cores=host_cores,
                         cpu_adam_s_per_param_core=cpu_adam_s_per_param_core, label=name, **kw)
        device = p.memory["device"]
        said = "formula (16-bit parameters, gradients, fp32 Adam)"
        if kw.get("offload_optimizer"):  # DeepSpeed's own estimate of what stays on the GPU (ZeRO-3: the largest layer)
            device = estimate(name, size.params, size.largest_layer)["device"]
            said = "DeepSpeed's estimator" + (" (of ZeRO-3 + offload: it has no NVMe option)" if kw["nvme"] else "")
        need = device + acts
        rows.append({"configuration": name, "trainable parameters": kw.get("trainable", size.params),
                     "model states on the GPU GB": device / GB, "of which says": said,
                     "activations (checkpointed) GB": acts / GB,
                     "GPU total GB": need / GB, "fits in GB": gpu.memory_bytes / GB, "fits": need <= gpu.memory_bytes,
                     "host GB": p.memory.get("host", 0.0) / GB, "NVMe GB": p.memory.get("nvme", 0.0) / GB,
                     "projected s/step": p.seconds})
        p.memory["activations"] = acts
        projections.append(p)
    return rows, projections


# ---------------------------------------------------------------- exercise: project a step yourself

SCENARIO = dict(model="GPT-2 XL", gpu="A100 40 GB", gpus=8, stage=2, tokens_per_gpu=8 * 1024, mfu=0.45)
TOLERANCE = 0.03     # both figures; GiB for GB (7 %), attention left out (9 %) or a non-embedding count (5 %) are outside
KEYS = ("device_gb", "step_seconds")
# what a function that only copies the course's projection would call (the check refuses it)
COURSE_PROJECTIONS = ("project.", "_course", "exercise_problem", "eight_b_on_24gb", "toy_projections", "machine.")


def _course(scenario: dict) -> dict:
    p = project.step(models.size(scenario["model"]), scenario["gpu"], scenario["gpus"], stage=scenario["stage"],
                     tokens_per_gpu=scenario["tokens_per_gpu"], mfu=scenario["mfu"])
    return {"device_gb": p.memory["device"] / GB, "step_seconds": p.seconds}


def runs_course_projection(fn) -> bool:
    """Whether calling ``fn`` runs any of the course's projection code (:mod:`.project`, :mod:`.machine` or this
    module), however it reached it: every Python call made while ``fn`` runs is watched."""
    import sys

    from course_utils.kernel.scale import machine

    watched = {project.__file__, machine.__file__, __file__}
    seen = []

    def watch(frame, event, arg):
        if event == "call" and frame.f_code.co_filename in watched:
            seen.append(frame.f_code.co_name)

    previous = sys.getprofile()
    sys.setprofile(watch)
    try:
        fn()
    except Exception:                                 # noqa: BLE001 - a function that fails is judged on its answer
        pass
    finally:
        sys.setprofile(previous)
    return bool(seen)


def exercise_problem(answer, fn=None, scenario: dict = SCENARIO) -> str | None:
    """What is wrong with a learner's projection (a dict of :data:`KEYS`) of :data:`SCENARIO`, in words that do not
    give the course's figures; None when both are within :data:`TOLERANCE`. ``fn``: the learner's function, which may
    not call the course's projection, by name or otherwise (the point is to know which counts make a step)."""
    if fn is not None:
        source = inspect.getsource(fn)
        if any(name in source for name in COURSE_PROJECTIONS) or runs_course_projection(fn):
            return "your function calls the course's projection: work the counts out yourself"
    if not isinstance(answer, dict) or set(KEYS) - set(answer):
        return f"return a dict with the keys {', '.join(KEYS)}"
    course = _course(scenario)
    said = []
    for key, what in (("device_gb", "the model states per GPU"), ("step_seconds", "the step time")):
        got = float(answer[key])
        if not abs(got / course[key] - 1) <= TOLERANCE:
            said.append(f"{what} is {'too high' if got > course[key] else 'too low'} (more than "
                        f"{TOLERANCE:.0%} away from the course's projection)")
    return "; ".join(said) or None


# ---------------------------------------------------------------- the same model, on this machine's toy runs first

def toy_projections(outcomes, figures) -> list[dict]:
    """For each configuration's largest size that trained (notebook 16's launches): its measured step time beside the
    step projected on this machine from its own measured figures (:func:`.machine.toy_step`)."""
    from course_utils.common.records.bigger import CONFIGURATIONS, MICRO_BATCH, POSITIONS, SEQ_LEN, SIZES
    from course_utils.common.zero_rules import offload_flags
    from course_utils.kernel.scale import machine

    rows = []
    for o in outcomes:
        best = getattr(o, "largest", None)
        if best is None:
            continue
        hidden, layers = SIZES[best.size]
        opt, par, nvme = offload_flags(CONFIGURATIONS[o.configuration][1])
        p = machine.toy_step(o.configuration, figures, best.params, best.params - POSITIONS * hidden,
                             MICRO_BATCH * SEQ_LEN, layers, hidden, SEQ_LEN, opt, par, nvme)
        rows.append({"configuration": o.configuration, "size": best.size, "measured s/step": best.step_seconds,
                     "projected s/step": p.seconds, "projected / measured": p.seconds / best.step_seconds,
                     "others' cores meanwhile": best.extra.get("others_cores", 0.0),
                     **{f"{t.name} s": t.seconds for t in p.terms}, "projection": p.record()})
    return rows


# ---------------------------------------------------------------- the counts first, from this notebook's own launches

CHECKED = {"ZeRO-2 + offload_optimizer": "stage 2 + offload", "ZeRO-3 + offload (CPU)": "stage 3 + offload"}


def count_check(outcomes) -> list[dict]:
    """What :func:`.counts.offload_moved` says one rank moves per step between device and host, beside the partitions
    the largest size of each CPU-offload configuration held after its last backward (notebook 04's check, on this
    notebook's launches: one rank)."""
    from course_utils.kernel.scale.offload import offload_agreement
    from course_utils.kernel.views.bigger import rung

    rows = []
    for o in outcomes:
        if o.configuration in CHECKED and o.largest is not None:
            for row in offload_agreement({CHECKED[o.configuration]: rung(o.largest)}, o.largest.params, 1, []):
                rows.append({**row, "count": f"{o.configuration}, {o.largest.size}: {row['count'].split(': ', 1)[1]}"})
    return rows
