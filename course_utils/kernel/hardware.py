"""What this machine can run: accelerator, communication backend, default number of ranks.

The course runs unchanged on a 2-core laptop (CPU ranks over gloo) and on GPU machines (one rank
per GPU over nccl); every default that depends on the machine is decided here, once.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

from course_utils.common import devices, paths

CPU_DEFAULT_PROCS = 2
MOST_RANKS = 4      # the most ranks one launch of the course starts on one machine (notebooks 01, 03, 13)


@dataclass(frozen=True)
class Hardware:
    accelerator: str            # "cpu" or "cuda" (DeepSpeed's accelerator name)
    gpus: int                   # CUDA devices visible to torch
    gpu_names: tuple = field(default_factory=tuple)
    cpu_cores: int = 1
    backend: str = "gloo"       # what deepspeed.init_distributed() will pick
    bf16: bool = True           # bf16 supported by the accelerator
    fp16: bool = True
    simulated: bool = False     # described (COURSE_MACHINE, the tests), not detected: its ranks compute on the CPU
    gpu_memory_bytes: int = 0   # memory of one GPU (torch's total_memory; a described machine's, from its name)

    @property
    def default_procs(self) -> int:
        """Ranks per launch: one per GPU, else two CPU ranks."""
        return self.gpus if self.gpus else CPU_DEFAULT_PROCS

    @property
    def is_gpu(self) -> bool:
        return self.gpus > 0

    @property
    def short(self) -> str:
        """The machine in a few words: "1 × NVIDIA H100 80GB HBM3", or "no GPU, 2 CPU cores"."""
        return f"{self.gpus} × {self.gpu_names[0]}" if self.is_gpu else f"no GPU, {self.cpu_cores} CPU cores"

    def line(self) -> str:
        """One sentence for the top of a notebook."""
        if self.is_gpu:
            fewer = (f" A launch whose lesson needs more ranks than {self.gpus} runs on CPU ranks over gloo, and its "
                     f"cell says so." if self.gpus < MOST_RANKS else "")
            return (f"This machine: {self.gpus} × {self.gpu_names[0]} → {self.default_procs} "
                    f"rank{'s' if self.default_procs > 1 else ''} over {self.backend}, one per GPU; CUDA memory is "
                    f"measured alongside the tensor accounting.{fewer}")
        return (f"This machine: no GPU, {self.cpu_cores} CPU cores → {self.default_procs} CPU ranks over "
                f"{self.backend}. Everything runs for real, only slower; on a GPU machine the same "
                f"cells run, and the opening box's \"On GPUs\" line says which launches use the GPUs there.")


# The share of one GPU's memory the model states of a sized lesson's model may take (16 bytes per parameter: bf16
# weights and gradients, fp32 master weights and Adam's two moments): the rest holds the lesson's activations, its
# buffers, and the engines a lesson builds one after another. GPT-2: on a 24 GB card GPT-2 small, on an 80 GB one
# GPT-2 medium, on a 141 GB one GPT-2 large; T5 (notebook 10): small, base, large.
SIZED_SHARE, SIZED_SHARE_WORDS = 1 / 8, "an eighth"
FAMILY_NAMES = {"gpt2": "GPT-2", "t5": "T5"}
STATE_BYTES_PER_PARAM = 16


def families() -> dict[str, dict]:
    """The published shapes a sized lesson may train, per model family, smallest first (each with ``params``)."""
    from course_utils.rank.models import GPU_SIZES
    from course_utils.rank.translation import T5_SIZES

    return {"gpt2": GPU_SIZES, "t5": T5_SIZES}


def model_size(hw: Hardware, family: str = "gpt2") -> str | None:
    """The model a lesson whose point is speed or memory trains on ``hw``'s GPU: the largest of ``family``'s sizes
    (:func:`families`: GPT-2 small, medium, large; T5 small, base, large) whose model states fit :data:`SIZED_SHARE`
    of one GPU's memory; None on a CPU (the lesson's own tiny model) or on a GPU too small for the smallest."""
    if not hw.is_gpu:
        return None
    fits = [name for name, p in families()[family].items()
            if p.params * STATE_BYTES_PER_PARAM <= hw.gpu_memory_bytes * SIZED_SHARE]
    return fits[-1] if fits else None


def sized_env(hw: Hardware, family: str = "gpt2") -> dict[str, str]:
    """The environment of a launch sized for ``hw`` (every model of ``family`` its ranks build has :func:`model_size`'s
    shape); empty where the lesson keeps its own model. Give it only to a launch that runs on the GPU."""
    from course_utils.rank.models import SIZE_ENV

    size = model_size(hw, family)
    return {SIZE_ENV: size} if size else {}


def size_line(hw: Hardware, lesson_model: str, family: str = "gpt2") -> str:
    """One sentence: which model this machine's sized launches train, and why."""
    size = model_size(hw, family)
    if size is None:
        where = "no GPU" if not hw.is_gpu else f"a GPU of {hw.gpu_memory_bytes / 1e9:.0f} GB"
        return f"Model: {lesson_model} ({where}: the lesson's own size)."
    p = families()[family][size]
    return (f"Model: {size} shape ({p.params / 1e6:.0f} M parameters), the largest of {FAMILY_NAMES[family]}'s "
            f"published sizes whose model states ({STATE_BYTES_PER_PARAM} bytes per parameter) take at most "
            f"{SIZED_SHARE_WORDS} of this {hw.gpu_names[0]}'s {hw.gpu_memory_bytes / 1e9:.0f} GB, in place of "
            f"{lesson_model}: on a GPU the lesson's own model would leave the device idle.")


@dataclass(frozen=True)
class Placement:
    """Where one launch's ranks run: how many per node, and whether on CPU although GPUs are here."""
    procs: int
    cpu_on_gpu_machine: bool = False
    note: str = ""              # one sentence for the cell when the launch does not use the GPUs


def placement(hw: Hardware, procs: int | None = None, min_ranks: int | None = None, nodes: int = 1) -> Placement:
    """The ranks of a launch on ``hw``: ``procs`` per node if given (else one per GPU, or 2 CPU ranks), raised to the
    ``min_ranks`` its lesson needs (partitioning, sharding or a world-size change mean nothing on one rank).
    A GPU machine with fewer GPUs than the launch starts on it (``procs`` × ``nodes``: simulated nodes and loopback
    hosts are all on this machine) runs the launch on CPU ranks over gloo (nccl needs one GPU per rank) and says so;
    launches about one device (offload, fp16 loss scaling, CUDA memory) give no ``min_ranks`` and keep the GPU."""
    want = procs if procs is not None else hw.default_procs
    if min_ranks is not None:
        want = max(want, min_ranks)
    here = want * max(1, nodes)
    if hw.is_gpu and here > hw.gpus:
        return Placement(want, True, f"This lesson needs {here} ranks and this machine has {hw.gpus} GPU"
                                     f"{'s' if hw.gpus != 1 else ''}: this launch runs {here} CPU ranks over gloo "
                                     f"(nccl needs one GPU per rank).")
    return Placement(want)


def cpu_ranks_env(world_size: int, gpu_machine: bool = False, cores: int | None = None) -> dict[str, str]:
    """What makes a launch's ranks CPU ranks over gloo: DeepSpeed's CPU accelerator (no probing, no warning), the
    ``cores`` (this machine's) shared instead of every rank spinning on all of them, OpenMP threads that sleep while
    they wait (``OMP_WAIT_POLICY=PASSIVE``: a rank's threads otherwise spin at every barrier, and when anything else
    runs beside the launch, another notebook's ranks in ``make course`` or ``make test``, the thread they wait for
    is off its core: a one-rank launch of notebook 02's training on 2 cores beside two busy processes trained in
    10-140 s with spinning threads and 4-6 s with sleeping ones; alone, 2.4-4.0 s and 4.5-5.5 s), and on a GPU machine no GPU
    visible to them (the rank hook hides it again after DeepSpeed's launcher has set ``CUDA_VISIBLE_DEVICES``) and
    the CPU builds of DeepSpeed's ops, in a folder of their own (:func:`paths.torch_extensions_dir`): the CUDA
    builds of fused_adam and cpu_adam have the same names."""
    cores = cores or os.cpu_count() or 1
    env = {devices.ACCELERATOR_ENV: "cpu", "OMP_NUM_THREADS": str(max(1, cores // max(1, world_size))),
           "OMP_WAIT_POLICY": "PASSIVE"}
    if gpu_machine:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["TORCH_EXTENSIONS_DIR"] = str(paths.torch_extensions_dir("cpu"))
    return env


def simulation_env(hw: Hardware, world_size: int) -> dict[str, str]:
    """On a described GPU machine (``COURSE_MACHINE``, :mod:`course_utils.common.devices`) with no GPU here: every
    launch's ranks compute on the CPU, as CPU ranks of that machine would, and their ``torch.cuda`` answers as that
    machine's would (``COURSE_SIMULATED_GPUS``). Empty elsewhere."""
    if not (hw.simulated and hw.is_gpu):
        return {}
    return {**cpu_ranks_env(world_size, gpu_machine=True), devices.SIMULATED_GPUS_ENV: str(hw.gpus),
            devices.MACHINE_ENV: ""}       # the ranks are not the described machine's kernel


def readable_arch_list(value: str | None) -> str | None:
    """``TORCH_CUDA_ARCH_LIST`` as DeepSpeed's JIT builder can read it, or None when ``value`` reads already.

    The builder sorts the entries by ``int()`` of each part (``compute_capability_args`` in
    ``deepspeed/ops/op_builder/builder.py``), so an arch with a letter suffix, such as the ``9.0a`` NVIDIA's PyTorch
    images set for Hopper, fails every build ("invalid literal for int() with base 10: '0a'"). Without the suffix
    (``9.0``) the same machine builds the ops, whose kernels use no arch-specific instructions."""
    if not value:
        return None
    entries = [a.strip() for a in value.replace(" ", ";").split(";") if a.strip()]

    def readable(arch: str) -> bool:
        return all(part.split("+")[0].isdigit() for part in arch.split("."))
    if all(readable(a) for a in entries):
        return None
    fixed = []
    for arch in entries:
        plain, _, ptx = arch.partition("+")
        plain = ".".join(part.rstrip("abcdefghijklmnopqrstuvwxyz") for part in plain.split("."))
        item = plain + ("+" + ptx if ptx else "")
        if item not in fixed:
            fixed.append(item)
    return ";".join(fixed)


def use_readable_arch_list(environ: dict | None = None) -> str | None:
    """Give this process (and the launches and op builds it starts) an arch list DeepSpeed can read; the one line
    that says so, or None when nothing changed."""
    env = os.environ if environ is None else environ
    fixed = readable_arch_list(env.get("TORCH_CUDA_ARCH_LIST"))
    if fixed is None:
        return None
    line = (f"TORCH_CUDA_ARCH_LIST={env['TORCH_CUDA_ARCH_LIST']!r} → {fixed!r} for DeepSpeed's op builds and the "
            f"ranks: its JIT builder reads only digits there.")
    env["TORCH_CUDA_ARCH_LIST"] = fixed
    return line


def describe(gpus: int, name: str = "NVIDIA H100 80GB HBM3", cores: int = 16, memory_gb: float | None = None) -> Hardware:
    """A machine as data: ``gpus`` × ``name`` and ``cores`` CPU cores (the tests' 1-, 2- and 8-GPU machines, and
    what ``COURSE_MACHINE`` describes); each GPU's memory is ``memory_gb`` (10⁹ bytes), else the course's hardware
    table's for the GPU ``name`` names (:func:`course_utils.kernel.scale.specs.named_by`)."""
    from course_utils.kernel.scale import specs

    if gpus and memory_gb is None:
        memory_gb = specs.named_by(name).memory_bytes / specs.GB
    return Hardware(accelerator="cuda" if gpus else "cpu", gpus=gpus, gpu_names=(name,) * gpus, cpu_cores=cores,
                    backend="nccl" if gpus else "gloo", simulated=True, gpu_memory_bytes=int((memory_gb or 0) * 1e9))


@functools.lru_cache(maxsize=None)
def detect() -> Hardware:
    """Ask torch and DeepSpeed's accelerator what is here (cached: it imports deepspeed once), or take the machine
    ``COURSE_MACHINE`` describes.

    It also points this process (and, through the environment, every launch from it) at the course's
    JIT-built DeepSpeed ops (:func:`paths.use_course_torch_extensions`), before DeepSpeed is imported, and gives
    it an arch list DeepSpeed's builder can read (:func:`use_readable_arch_list`, said in one line).
    """
    paths.use_course_torch_extensions()
    changed = use_readable_arch_list()
    if changed:
        print(changed, flush=True)
    machine = devices.described()
    if machine is not None:      # nothing here to compute on but the CPU: DeepSpeed in this process uses it, quietly
        os.environ.setdefault(devices.ACCELERATOR_ENV, "cpu")
        return describe(int(machine["gpus"]), cores=int(machine.get("cores", os.cpu_count() or 1)),
                        **{k: machine[k] for k in ("name", "memory_gb") if k in machine})
    import torch

    if not torch.cuda.is_available():      # skip DeepSpeed's probing (and its warning) on a CPU machine
        os.environ.setdefault(devices.ACCELERATOR_ENV, "cpu")
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
        gpu_memory_bytes=torch.cuda.get_device_properties(0).total_memory if gpus else 0,
    )


def needs_gpu(what: str) -> bool:
    """True when a GPU is here; otherwise print why ``what`` is skipped on this machine."""
    if detect().is_gpu:
        return True
    print(f"⏭  {what}: needs a CUDA GPU, and this machine has none. The explanation above stands; "
          f"run this notebook on a GPU machine to see it measured.")
    return False
