"""A step-time model: each term is a count (FLOPs, bytes, parameters) divided by a rate (a published peak times an
assumed efficiency, or a rate this machine measured). What overlaps is said, not hidden: the collectives overlap the
backward's compute (``overlap_comm``) and count only where they are longer; offload transfers, the CPU optimizer step
and NVMe run before or after the device's compute in DeepSpeed's default schedule and add to it.

Every figure a projection prints is "projected on <GPU>": the counts are measured or checked in the run, the rates
come from ``hardware.toml`` (with sources) and the assumptions below, which the learner can change."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from course_utils.common import zero_rules
from course_utils.kernel.scale import counts, specs
from course_utils.kernel.scale.models import Size

MFU = 0.40                # a well-tuned transformer step reaches 35–50 % of the dense bf16 peak on current GPUs
LINK_EFFICIENCY = 0.80    # of a link's published bandwidth, what a large collective or copy gets
HOST_CORES_PER_GPU = 8    # CPU cores of the host that run one GPU's share of DeepSpeedCPUAdam


@dataclass
class Term:
    name: str
    count: float
    unit: str                 # FLOP | B | parameters
    rate: float               # count per second
    rate_says: str            # where the rate comes from
    overlaps_compute: bool = False

    @property
    def seconds(self) -> float:
        return self.count / self.rate if self.count else 0.0


@dataclass
class Projection:
    label: str
    hardware: str
    terms: list
    assumptions: dict
    memory: dict = field(default_factory=dict)     # bytes per GPU by place: device, host, nvme

    @property
    def seconds(self) -> float:
        compute = sum(t.seconds for t in self.terms if t.name == "compute")
        hidden = max([compute] + [t.seconds for t in self.terms if t.overlaps_compute])
        return hidden + sum(t.seconds for t in self.terms if t.name != "compute" and not t.overlaps_compute)

    def share(self, name: str) -> float:
        """One term's share of the step (its seconds over the step's, overlapped terms counted where they show)."""
        term = next((t for t in self.terms if t.name == name), None)
        return term.seconds / self.seconds if term is not None and self.seconds else 0.0

    def frame(self):
        import pandas as pd

        return pd.DataFrame([{"term": t.name, "count": f"{t.count:.3g} {t.unit}", "rate": t.rate_says,
                              "seconds": t.seconds, "overlaps compute": t.overlaps_compute} for t in self.terms]
                            ).set_index("term")

    def line(self) -> str:
        return (f"{self.label}: projected on {self.hardware}: {self.seconds:.3g} s a step ("
                + ", ".join(f"{t.name} {t.seconds:.3g} s" for t in self.terms) + ")")

    def record(self) -> dict:
        return {"label": self.label, "hardware": self.hardware, "seconds": self.seconds, "assumptions": self.assumptions,
                "memory": self.memory,
                "terms": [{**asdict(t), "seconds": t.seconds} for t in self.terms]}


def terms_table(projections: list[Projection]):
    """Every term of every projection: its count, the rate it is divided by and where that rate comes from."""
    import pandas as pd

    return pd.concat({(p.hardware, p.label): p.frame() for p in projections}, names=["projected on", "step", "term"])


def assumptions_line(projections: list[Projection]) -> str:
    """The assumptions the projections share, in one line (those that differ are in the tables)."""
    first = projections[0].assumptions
    same = {k: v for k, v in first.items()
            if v is not None and all(p.assumptions.get(k) == v for p in projections[1:])}
    return "assumed: " + "; ".join(f"{k} {v}" for k, v in same.items())


def compute_term(flops: float, gpu: specs.Gpu, mfu: float = MFU) -> Term:
    return Term("compute", flops, "FLOP", gpu.bf16_flops * mfu,
                f"{gpu.bf16_flops / 1e12:g} TFLOP/s bf16 peak × MFU {mfu:g} ({gpu.name})")


def link_term(name: str, sent: float, link: specs.Link, efficiency: float = LINK_EFFICIENCY,
              overlaps_compute: bool = False) -> Term:
    return Term(name, sent, "B", link.bytes_s * efficiency,
                f"{link.name}: {link.bytes_s / 1e9:g} GB/s × {efficiency:g}", overlaps_compute)


def step(model: Size, gpu: specs.Gpu | str, gpus: int = 1, stage: int = 3, tokens_per_gpu: int | None = None,
         offload_optimizer: bool = False, offload_param: bool = False, nvme: bool = False,
         recompute: bool | float = False,
         frozen_share: float = 0.0, trainable: float | None = None, mfu: float = MFU,
         efficiency: float = LINK_EFFICIENCY, host_cores: int = HOST_CORES_PER_GPU,
         cpu_adam_s_per_param_core: float | None = None, drive: specs.Drive | None = None,
         max_in_cpu: float = 1e9, gpus_per_node: int = 8, label: str = "") -> Projection:
    """One optimizer step of ``model`` on ``gpus`` × ``gpu`` at a ZeRO stage, bf16 mixed precision, ``tokens_per_gpu``
    tokens each (default: one sample of the model's sequence length).

    ``trainable``: parameters with gradients and optimizer states (LoRA: the adapters; default all); ``frozen_share``:
    the share of the backward's weight-gradient work skipped (1.0 for a frozen base). ``recompute``: the share of a
    forward that activation checkpointing runs again (True: all of it). ``nvme`` offloads the optimizer states to the
    drive (and with ``offload_param`` the parameters), so it implies ``offload_optimizer``. ``cpu_adam_s_per_param_core``:
    DeepSpeedCPUAdam's seconds per parameter on one core, measured by :mod:`.machine` (needed with offload).
    ``max_in_cpu``: with ``nvme``, the parameter elements per GPU kept in host memory (``offload_param.max_in_cpu``,
    DeepSpeed's default 1e9); only the rest are read from the drive."""
    gpu = specs.gpu(gpu) if isinstance(gpu, str) else gpu
    tokens = tokens_per_gpu or model.tokens_per_sample
    psi = float(model.params)
    train = psi if trainable is None else float(trainable)
    fwd = counts.forward_flops(model.matmul_params, tokens, model.layers, model.hidden, model.tokens_per_sample)
    terms = [compute_term(counts.step_flops(fwd, recompute, frozen_share), gpu, mfu)]
    offload_optimizer = offload_optimizer or nvme
    if gpus > 1:
        link = gpu.gpu_link if gpus <= gpus_per_node else specs.network()
        sent = counts.zero_sent(stage, train, gpus, 2)
        if stage == 3 and train < psi:       # the frozen parameters are gathered too (forward and backward)
            sent += 2 * (gpus - 1) / gpus * (psi - train) * 2
        terms.append(link_term("collectives", sent, link, efficiency, overlaps_compute=True))
    if offload_optimizer or offload_param:
        moved = counts.offload_moved(train, gpus, offload_optimizer, offload_param, stage=stage)
        terms.append(link_term("offload transfers", moved["to host"] + moved["to device"], gpu.host_link, efficiency))
        if cpu_adam_s_per_param_core is None:
            raise ValueError("an offloaded optimizer step needs DeepSpeedCPUAdam's measured rate: "
                             "cpu_adam_s_per_param_core (course_utils.kernel.scale.machine)")
        terms.append(Term("CPU Adam", train / gpus, "parameters", host_cores / cpu_adam_s_per_param_core,
                          f"DeepSpeedCPUAdam measured here: {cpu_adam_s_per_param_core * 1e9:.3g} ns a parameter on "
                          f"one core, × {host_cores} host cores"))
    if nvme:
        drive = drive or specs.drive()
        moved = counts.nvme_moved(train, gpus, offload_param, max_in_cpu=max_in_cpu)
        terms.append(Term("NVMe", moved["read"], "B", drive.read_bytes_s,
                          f"{drive.name}: read {drive.read_bytes_s / 1e9:g} GB/s"))
        terms.append(Term("NVMe write", moved["write"], "B", drive.write_bytes_s,
                          f"{drive.name}: write {drive.write_bytes_s / 1e9:g} GB/s"))
    zero = {}
    if offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if offload_param:
        zero["offload_param"] = {"device": "cpu"}
    states = zero_rules.per_rank_placement(train, stage, gpus, "bf16", zero)
    frozen = (psi - train) * 2 / (gpus if stage == 3 else 1)     # 16-bit frozen weights, partitioned at stage 3
    where = "host" if offload_param else "device"
    memory = {side: sum(v[side] for v in states.values()) + (frozen if where == side else 0.0)
              for side in ("device", "host")}
    if nvme:     # the host side goes to the drive but for the 16-bit parameters up to max_in_cpu and the gradient partition,
        #          which stage 3 allocates whole in host memory (grad_partitions_flat_buffer) and whose fp32 copy backward
        #          writes to the drive (swap_out_gradients, as counts.nvme_moved counts it; notebook 16 measures both)
        kept = min(train / gpus, max_in_cpu) * 2 if offload_param else 0.0
        grads = states["grads"]["host"]
        memory["nvme"] = memory["host"] - kept - grads + 4 * train / gpus
        memory["host"] = kept + grads
    assumptions = {"MFU": mfu, "link efficiency": efficiency, "tokens per GPU": tokens, "stage": stage,
                   "GPUs": gpus, "host cores per GPU": host_cores if (offload_optimizer or offload_param) else None,
                   "recompute": recompute,
                   "overlap": "collectives hidden behind compute" + ("; offload, CPU Adam and NVMe added to it"
                                                                     if offload_optimizer or offload_param else "")}
    return Projection(label or model.name, f"{gpus} × {gpu.name}", terms, assumptions, memory)
