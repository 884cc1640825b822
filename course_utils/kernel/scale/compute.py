"""Real scale for notebooks 11 and 13: what a training step computes, what its forward pass keeps for the backward
pass, and what a pipeline's stages hand each other. Each count is first put beside the one the notebook's run
measured at toy size, then carried to a real model on named GPUs as a projection (:mod:`.project`).

- :class:`Decoder`: a decoder's sizes as the formulas need them (a GPT-2 block and a Llama block keep different
  tensors); :func:`toy` and :func:`real` make one;
- FLOPs: :func:`blocks_share` (what checkpointing reruns), :func:`profiler_step_factor` (DeepSpeed's own rule);
- activations: :func:`kept_per_token`;
- notebook 11: :func:`checkpointing_agreement` (the counts), :func:`checkpointing_trade` (the projection);
- notebook 13: :func:`pipeline_agreement` (the counts), :func:`pipeline_step`, :func:`bubble_at_real_size` and
  :func:`pipeline_or_zero3` (the projections);
- :func:`explain`: the rates, assumptions and sources printed beside a table of projections.
"""
from __future__ import annotations

from dataclasses import dataclass

from course_utils.common import zero_rules
from course_utils.kernel.scale import counts, models, project, specs

FP32 = 4           # bytes: norm statistics, RMSNorm's upcast copy and the loss's log-probabilities are fp32 in any dtype
INDEX = 8          # bytes of an int64 label
BF16 = 2           # bytes of an activation in a bf16 run
FAMILIES = {"GPT2LMHeadModel": "GPT-2", "LlamaForCausalLM": "Llama"}


@dataclass(frozen=True)
class Decoder:
    """A decoder-only transformer's sizes. ``family`` says what its blocks keep: "GPT-2" (LayerNorm, one fused
    q-k-v matmul, the tanh-formula GELU ``gelu_new``) or "Llama" (RMSNorm computed in fp32, rotary q and k, grouped
    key-value heads, a SwiGLU MLP)."""
    name: str
    family: str
    layers: int
    hidden: int
    ffn: int                  # the MLP's inner width
    heads: int
    kv_hidden: int            # the width of keys and values: key-value heads × head size
    vocab: int

    @property
    def layer_matmul_params(self) -> int:
        """Weights one block multiplies a token with: q, k, v and the attention output; the MLP's two (GPT-2) or
        three (Llama: gate, up, down) matrices. Biases and norms work element by element: not counted."""
        attention = self.hidden * (self.hidden + 2 * self.kv_hidden) + self.hidden ** 2
        return attention + (2 if self.family == "GPT-2" else 3) * self.hidden * self.ffn

    @property
    def matmul_params(self) -> int:
        """Every block's matmul weights and the LM head (a matmul, tied to the input embedding or not)."""
        return self.layers * self.layer_matmul_params + self.vocab * self.hidden

    def forward_per_token(self, seq: int) -> float:
        """Forward FLOPs of one token in a sequence of ``seq``: :func:`counts.forward_flops`."""
        return counts.forward_flops(self.matmul_params, 1, self.layers, self.hidden, seq)


def toy(preset: str = "zero_lab", size: str | None = None) -> Decoder:
    """The course's GPT-2 of ``preset`` (``course_utils.rank.models.PRESETS``), or the GPU size ``size`` a sized launch
    built in its place (``hardware.model_size``)."""
    from course_utils.rank.models import preset as shape

    p = shape(preset, size)
    return Decoder(f"GPT-2 {size or preset}", "GPT-2", p.n_layer, p.n_embd, 4 * p.n_embd, p.n_head, p.n_embd, p.vocab_size)


def real(name: str) -> Decoder:
    """A dense decoder of :data:`models.REAL_MODELS` (GPT-2 XL, the Llama-3-8B shape), from its published config."""
    m = models.REAL_MODELS[name]
    if m.cls not in FAMILIES:
        raise ValueError(f"{name} is a {m.cls}: the activation and recompute formulas know the dense decoders "
                         f"{', '.join(FAMILIES)}")
    c = m.config
    if FAMILIES[m.cls] == "GPT-2":
        h = c["n_embd"]
        return Decoder(name, "GPT-2", c["n_layer"], h, c.get("n_inner") or 4 * h, c["n_head"], h, c["vocab_size"])
    h, heads = c["hidden_size"], c["num_attention_heads"]
    return Decoder(name, "Llama", c["num_hidden_layers"], h, c["intermediate_size"], heads,
                   c.get("num_key_value_heads", heads) * h // heads, c["vocab_size"])


# ---------------------------------------------------------------- FLOPs

def blocks_share(dec: Decoder, seq: int, early_stop: bool = False) -> float:
    """The share of a forward pass that checkpointing every block runs again in the backward pass: the blocks'
    FLOPs over the whole forward's (the LM head lies outside the blocks and is not rerun).

    ``early_stop``: torch's non-reentrant checkpoint, transformers' default, stops a block's rerun as soon as the
    last tensor its backward needs is back (``set_checkpoint_early_stop`` in ``torch/utils/checkpoint.py``): that
    tensor is the input of the MLP's output matmul, so that matmul is not rerun. DeepSpeed's
    ``deepspeed.checkpointing.checkpoint`` reruns the whole block."""
    layer = 2 * dec.layer_matmul_params + 4 * seq * dec.hidden
    if early_stop:
        layer -= 2 * dec.hidden * dec.ffn
    return dec.layers * layer / dec.forward_per_token(seq)


def measured_blocks_share(modules: list[dict]) -> float:
    """The same share from the flops profiler's per-module counts (``FlopsProfile.modules``): the blocks'
    (``transformer.h.<i>``) forward FLOPs over the whole model's."""
    whole = next(r["fwd_flops"] for r in modules if r["module"] == "(whole model)")
    return sum(r["fwd_flops"] for r in modules if r["module"].startswith("transformer.h.")) / whole


class _Timer:
    def elapsed(self, reset: bool = True) -> float:
        return 1.0


class _Engine:
    """What ``FlopsProfiler.print_model_profile`` reads of an engine: its sizes and its wall-clock timers."""
    world_size = dp_world_size = mp_world_size = 1
    has_moe_layers = False

    def train_micro_batch_size_per_gpu(self) -> int:
        return 1

    def wall_clock_breakdown(self) -> bool:
        return True

    def timers(self, name: str) -> _Timer:
        return _Timer()


def profiler_step_factor(recompute_fwd_factor: float) -> float:
    """How many forward passes' FLOPs DeepSpeed's flops profiler counts per training step for a
    ``recompute_fwd_factor``: its own ``print_model_profile``, run on a one-layer model with a stand-in engine, and
    read back from what it printed ("FLOPS per GPU = k * fwd flops per GPU / iter latency")."""
    import contextlib
    import io

    import torch
    from deepspeed.profiling.flops_profiler.profiler import FlopsProfiler

    from course_utils.kernel.views.perf import deepspeed_step_factor

    model = torch.nn.Linear(2, 2)
    profiler = FlopsProfiler(model, _Engine(), recompute_fwd_factor)
    profiler.start_profile()
    try:
        model(torch.ones(1, 2))
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            profiler.print_model_profile(detailed=False)
    finally:
        profiler.end_profile()
    return deepspeed_step_factor(printed.getvalue())


# ---------------------------------------------------------------- activations

def kept_per_token(dec: Decoder, b: float, checkpointed: bool = False) -> dict[str, float]:
    """Bytes the forward pass keeps for the backward pass, per token, with activations of ``b`` bytes (4: fp32, 2:
    bf16) and attention by a fused kernel (scaled_dot_product_attention: no sequence × sequence matrix is kept).

    A block keeps, per token: for each norm its input (GPT-2's LayerNorm: in ``b`` bytes, with its mean and 1/std in
    fp32; Llama's RMSNorm: its fp32 copy and 1/rms, and the normalised input) and its output, which the next matmul
    keeps; attention's q, k and v (Llama: after rotary, k and v of the key-value width), its output and one fp32
    log-sum-exp per head; the MLP's tensors: GPT-2's ``gelu_new`` keeps four of the inner width (its tanh formula is
    written with tensor operators) and the output matmul its input; Llama's SwiGLU keeps gate, silu(gate), up and
    their product. With ``checkpointed`` a block keeps its input only. Outside the blocks: the final norm, the loss's
    fp32 log-probabilities (one per vocabulary entry) and the label."""
    h, f = dec.hidden, dec.ffn
    if dec.family == "GPT-2":
        norm = b * h + 2 * FP32 + b * h
        attention = b * 3 * h + b * h + FP32 * dec.heads
        mlp = 4 * b * f + b * f
    else:
        norm = FP32 * h + FP32 + b * h + b * h
        attention = b * (h + 2 * dec.kv_hidden) + b * h + FP32 * dec.heads
        mlp = 4 * b * f
    layer = b * h if checkpointed else 2 * norm + attention + mlp
    outside = norm + FP32 * dec.vocab + INDEX
    return {"per layer": layer, "layers": dec.layers * layer, "outside the layers": outside,
            "total": dec.layers * layer + outside}


def checkpointing_agreement(profile, printed_factor: float, activations: list, hidden: tuple[int, int],
                            size: str | None = None) -> list[dict]:
    """Notebook 11's counts beside the formulas its projection uses, at the toy GPT-2's size: the flops profiler's
    forward FLOPs (``FlopsProfile``), the step factor DeepSpeed printed in this run's profile (``printed_factor``) and
    the one its profiler prints with ``recompute_fwd_factor`` 1.0, the blocks' share of the forward from the profile's
    per-module counts, and the activation bytes per token each checkpointing setting kept (rank 0's ``Activation``
    records) at the largest point measured, exercise 2's ``hidden`` point left out; ``size``: the GPT-2 the activations
    were measured on where their launch was sized for a GPU (the profile's model is the course's own)."""
    dec = toy()
    tokens, seq = profile.micro_batch * profile.seq_len, profile.seq_len
    forward = counts.forward_flops(dec.matmul_params, tokens, dec.layers, dec.hidden, seq)
    rows = [counts.agreement(f"forward FLOPs of a micro-batch ({profile.micro_batch} × {seq} tokens)", forward,
                             profile.fwd_flops),
            counts.agreement("step ÷ forward FLOPs (this run's profile, recompute_fwd_factor 0)",
                             counts.step_flops(1.0), printed_factor),
            counts.agreement("step ÷ forward FLOPs, recompute_fwd_factor 1.0 (the profiler, here)",
                             counts.step_flops(1.0, recompute=True), profiler_step_factor(1.0)),
            counts.agreement("the blocks' share of the forward FLOPs", blocks_share(dec, seq),
                             measured_blocks_share(profile.modules))]
    shown = [a for a in activations if (a.seq_len, a.batch) != tuple(hidden)]
    largest = max(a.seq_len * a.batch for a in shown)
    for a in shown:
        if a.seq_len * a.batch == largest:
            rows.append(counts.agreement(
                f"activation bytes per token, checkpointing {a.checkpointing} ({a.batch} × {a.seq_len} tokens)",
                kept_per_token(toy(size=size), FP32, a.checkpointing != "off")["total"],
                a.after_forward / (a.seq_len * a.batch)))
    return rows


# ---------------------------------------------------------------- notebook 11: checkpointing's trade at real size

GB = 1e9
TRADE_SETUPS = (("H100 80 GB", 1), ("A100 40 GB", 8))


def _states(size: models.Size, gpus: int) -> tuple[int, dict, dict]:
    """The ZeRO set-up a bf16 Adam fine-tune of ``size`` takes on ``gpus``: ZeRO-3 over several GPUs; on one GPU,
    where 16 bytes a parameter do not fit, ZeRO-2 with the optimizer offloaded (notebook 04). Its model-state bytes
    per GPU on the device and on the host (``zero_rules.per_rank_placement``)."""
    stage, zero = (3, {}) if gpus > 1 else (2, zero_rules.OPTIMIZER_TO_HOST)
    placed = zero_rules.per_rank_placement(size.params, stage, gpus, "bf16", zero).values()
    return stage, zero, {side: sum(p[side] for p in placed) for side in ("device", "host")}


def _gpu_compute(size: models.Size, gpu: specs.Gpu, tokens: int, recompute: float, mfu: float, stage: int,
                 memory: dict, label: str) -> project.Projection:
    """One GPU's forward, backward and recompute alone: what checkpointing changes in a step whose optimizer runs on
    the host."""
    forward = counts.forward_flops(size.matmul_params, tokens, size.layers, size.hidden, size.tokens_per_sample)
    return project.Projection(
        label + " (the GPU's compute: the offloaded optimizer step not included)", f"1 × {gpu.name}",
        [project.compute_term(counts.step_flops(forward, recompute), gpu, mfu)],
        {"MFU": mfu, "tokens per GPU": tokens, "stage": stage, "GPUs": 1, "recompute": recompute,
         "not counted": "the offloaded optimizer (states and gradients on the host, ZeRO-Offload): its transfers "
                        "and CPU step add to these seconds, the same with and without recompute"}, dict(memory))


def checkpointing_trade(model: str = "Llama-3-8B shape", setups=TRADE_SETUPS, tokens=(4096, 16384),
                        early_stop: bool = True, mfu: float = project.MFU) -> tuple[list[dict], list]:
    """Activation checkpointing at real size, off and on: the activation bytes a GPU keeps (:func:`kept_per_token`,
    bf16) beside its model states and its memory, and the step projected without and with the recompute (the blocks'
    share of a forward, :func:`blocks_share`; ``early_stop``: transformers' checkpointing). Several GPUs: ZeRO-3
    (:func:`project.step`, collectives hidden behind compute). One GPU: the optimizer offloaded, and only the GPU's
    compute projected. Returns the table's rows and the projections."""
    size, dec = models.size(model), real(model)
    share = blocks_share(dec, size.tokens_per_sample, early_stop)
    said = f"with checkpointing, {share:.2f} of a forward: the blocks" + (
        ", each without its MLP output matmul (torch's early stop)" if early_stop else "")
    rows, projections = [], []
    for gpu_name, gpus in setups:
        gpu = specs.gpu(gpu_name)
        stage, zero, states = _states(size, gpus)
        for t in tokens:
            for checkpointed in (False, True):
                recompute = share if checkpointed else 0.0
                label = f"{model}, {t} tokens per GPU, checkpointing {'on' if checkpointed else 'off'}"
                proj = (project.step(size, gpu, gpus, stage, t, recompute=recompute, mfu=mfu, label=label) if gpus > 1
                        else _gpu_compute(size, gpu, t, recompute, mfu, stage, states, label))
                kept = kept_per_token(dec, BF16, checkpointed)["total"] * t
                proj.assumptions.update({"recompute counted": said,
                                         "activations": "kept at the end of the forward, bf16, fused attention; the "
                                                        "backward's temporaries and ZeRO-3's gathered layers come on top"})
                proj.memory["activations"] = kept
                projections.append(proj)
                rows.append({"projected on": proj.hardware, "ZeRO": f"{stage}" + (" + optimizer offload" if zero else ""),
                             "tokens per GPU": t, "checkpointing": "on" if checkpointed else "off",
                             "activations GB": kept / GB, "model states GB": states["device"] / GB,
                             "total GB": (kept + states["device"]) / GB, "GPU GB": gpu.memory_bytes / GB,
                             "fits": kept + states["device"] <= gpu.memory_bytes, "seconds": proj.seconds})
    return rows, projections


def explain(projections: list, gpus, across_machines: bool = False,
            shown=("tokens per GPU", "recompute", "micro-batches", "GPUs", "replicas", "stages")) -> list[str]:
    """What a reader needs beside a table of projections: each rate and where it comes from, the assumptions (those
    all share, then those of each kind of projection, named by its hardware or its label; ``shown``: the ones the table
    already has), and the sources of the hardware's figures."""
    from course_utils.kernel.scale.project import assumptions_line
    from course_utils.kernel.scale.wire import sources

    lines = ["rates: " + "; ".join(dict.fromkeys(t.rate_says for p in projections for t in p.terms)),
             assumptions_line(projections)]
    first = projections[0].assumptions
    common = {k for k, v in first.items() if all(p.assumptions.get(k) == v for p in projections)}
    kinds: dict[tuple, list] = {}
    for p in projections:
        kinds.setdefault(tuple(sorted(p.assumptions)), []).append(p)
    for kind in kinds.values():
        own = {k: v for k, v in kind[0].assumptions.items() if k not in common and k not in shown and v is not None
               and all(p.assumptions.get(k) == v for p in kind)}
        if own:
            name = kind[0].hardware if len({p.hardware for p in kind}) == 1 else kind[0].label.split(", ")[1]
            lines.append(f"{name}: " + "; ".join(f"{k} {v}" for k, v in own.items()))
    return lines + ["source: " + s for s in sources(gpus, across_machines)]


# ---------------------------------------------------------------- notebook 13: a pipeline at real stage times

def handover_bytes(tokens: int, hidden: int, b: float) -> float:
    """One micro-batch's activation crossing a stage boundary (or its gradient, coming back): tokens × hidden × b."""
    return tokens * hidden * b


def pipeline_agreement(bubbles: list, sent: list) -> list[dict]:
    """Notebook 13's counts beside the formulas its projection uses, per m: the share of schedule steps both stages
    idled (``Bubble`` records) against (p − 1)/(m + p − 1), and the bytes that crossed the stage boundary in both
    directions (``StageBytes``: stage 0's activations, stage 1's gradients) against 2 · m · handover_bytes."""
    rows = []
    for m in sorted({b.m for b in bubbles}):
        at = [b for b in bubbles if b.m == m]
        rows.append(counts.agreement(f"m = {m}: share of schedule steps idle, both stages",
                                     counts.bubble(at[0].stages, m),
                                     sum(b.idle_steps for b in at) / sum(b.steps for b in at)))
    for m in sorted({s.m for s in sent}):
        at = [s for s in sent if s.m == m]
        tokens, hidden = at[0].activation_shape
        rows.append(counts.agreement(f"m = {m}: bytes across the stage boundary, both ways",
                                     2 * m * handover_bytes(tokens, hidden, at[0].element_bytes),
                                     sum(v for s in at for v in s.sent.values())))
    return rows


def pipeline_step(size: models.Size, stages: int, micro_batches: int, gpu: specs.Gpu | str, link: str,
                  replicas: int = 1, replica_link: str | None = None, mfu: float = project.MFU,
                  efficiency: float = project.LINK_EFFICIENCY) -> project.Projection:
    """One step of a 1F1B pipeline of ``stages`` GPUs over ``micro_batches`` micro-batches of one sample each
    (``size.tokens_per_sample`` tokens), bf16, stages of equal FLOPs.

    A micro-batch's forward + backward on one stage takes its FLOPs (3 forwards, :func:`counts.step_flops`, over the
    stages) at the GPU's rate; the pipeline runs m of them and p − 1 more to fill and drain (the bubble). Each of those
    m + p − 1 slots also hands an activation forward and a gradient back over ``link``: DeepSpeed's ``p2p.send`` waits
    for its send (``dist.send``), so a hand-over adds to its stage's time. With ``replicas`` pipelines side by side,
    each stage's gradients are all-reduced over them after the last backward (over ``replica_link``)."""
    gpu = specs.gpu(gpu) if isinstance(gpu, str) else gpu
    t = size.tokens_per_sample
    forward = counts.forward_flops(size.matmul_params, t, size.layers, size.hidden, t)
    slot = counts.step_flops(forward) / stages
    busy = project.compute_term(micro_batches * slot, gpu, mfu)
    terms = [busy, project.Term("bubble", (stages - 1) * slot, "FLOP", busy.rate, busy.rate_says),
             project.link_term("hand-overs", 2 * (micro_batches + stages - 1) * handover_bytes(t, size.hidden, BF16),
                               specs.link(link), efficiency)]
    if replicas > 1:
        sent = counts.zero_sent(0, size.params / stages, replicas, BF16)
        terms.append(project.link_term("gradient all-reduce", sent, specs.link(replica_link or link), efficiency))
    assumptions = {"MFU": mfu, "link efficiency": efficiency, "stages": stages, "micro-batches": micro_batches,
                   "tokens per micro-batch": t, "replicas": replicas, "GPUs": stages * replicas,
                   "balance": "stages of equal FLOPs",
                   "overlap": "none: a send holds its stage until it is done; the gradient all-reduce follows the "
                              "last backward"}
    return project.Projection(f"{size.name}, {stages} stages, m = {micro_batches}, hand-overs over {link}",
                              f"{stages * replicas} × {gpu.name}", terms, assumptions)


def idle_share(proj: project.Projection) -> float:
    """The share of a pipeline's window (up to the end of its last backward) a stage spends not computing."""
    window = [t for t in proj.terms if t.name in ("compute", "bubble", "hand-overs")]
    return 1 - window[0].seconds / sum(t.seconds for t in window)


PIPE_LINKS = ("NVLink 4 (H100)", "InfiniBand NDR 400 Gb/s")


def bubble_at_real_size(model: str = "Llama-3-8B shape", stages=(4, 8), micro_batches=(1, 2, 4, 8, 16, 32),
                        gpu: str = "H100 80 GB", links=PIPE_LINKS) -> tuple[list[dict], list]:
    """The idle share of :func:`pipeline_step` for each m, number of stages and link between stages, beside the
    formula; and the projections at m = 8 and at the largest m."""
    size = models.size(model)
    rows, kept = [], []
    for m in micro_batches:
        row = {"m": m}
        for p in stages:
            row[f"p = {p}: formula"] = counts.bubble(p, m)
            for link in links:
                proj = pipeline_step(size, p, m, gpu, link)
                row[f"p = {p}: {link.split(' (')[0].split(' NDR')[0]}"] = idle_share(proj)
                if m in (8, max(micro_batches)):
                    kept.append(proj)
        rows.append(row)
    return rows, kept


def pipeline_or_zero3(model: str = "Llama-3-8B shape", gpus=(8, 64), tokens_per_gpu=(4096, 16384), stages: int = 8,
                      gpu: str = "H100 80 GB", per_node: int = 8, even: float = 0.1) -> tuple[list[dict], list]:
    """The same tokens per GPU and step trained by ZeRO-3 over all N GPUs, or by a pipeline of ``stages`` (one stage
    per machine) with N / stages data-parallel replicas inside each machine: the bytes each GPU sends per step and the
    projected steps. ZeRO-3 sends 3(N − 1)/N · Ψ · 2 bytes over InfiniBand (:func:`counts.zero_sent`; 8 GPUs: one per
    machine), hidden behind compute where compute is longer; a middle stage sends each micro-batch's activation and
    its gradient, m = stages × tokens per GPU ÷ a sample's tokens. Steps within ``even`` of each other: "about even"."""
    size = models.size(model)
    t = size.tokens_per_sample
    rows, kept = [], []
    for n in gpus:
        replicas = n // stages
        for tokens in tokens_per_gpu:
            m = stages * tokens // t
            zero3 = project.step(size, gpu, n, 3, tokens, gpus_per_node=1 if n <= per_node else per_node,
                                 label=f"{model}, ZeRO-3, {tokens} tokens per GPU")
            zero3.assumptions["machines"] = f"{n} of 1 GPU" if n <= per_node else f"{n // per_node} of {per_node} GPUs"
            pipe = pipeline_step(size, stages, m, gpu, specs.network().name, replicas, specs.gpu(gpu).gpu_link.name)
            ratio = pipe.seconds / zero3.seconds
            rows.append({"GPUs": n, "tokens per GPU": tokens, "pipeline": f"{stages} stages × {replicas}, m = {m}",
                         "ZeRO-3 sends GB (InfiniBand)": counts.zero_sent(3, size.params, n, BF16) / GB,
                         "pipeline sends GB (InfiniBand)": 2 * m * handover_bytes(t, size.hidden, BF16) / GB,
                         "pipeline sends GB (NVLink)": (counts.zero_sent(0, size.params / stages, replicas, BF16)
                                                        if replicas > 1 else 0.0) / GB,
                         "ZeRO-3 step s": zero3.seconds, "pipeline step s": pipe.seconds,
                         "pipeline bubble": idle_share(pipe),
                         "faster": ("about even" if abs(ratio - 1) < even else "pipeline" if ratio < 1 else "ZeRO-3")})
            kept += [zero3, pipe]
    return rows, kept
