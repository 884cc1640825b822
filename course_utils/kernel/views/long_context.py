"""Notebook 17's launches and tables: Ulysses sequence parallelism for a Hugging Face model (``scripts/17_long_context.py``),
read against what the notebook states — the one-process reference, the all-to-all formula computed here from the
model's shape, DeepSpeed's sharding of each sample — never against the figure a value was computed from."""
from __future__ import annotations

from dataclasses import dataclass

from course_utils.common.record import read_as
from course_utils.common.records.long_context import HeadRule, Reference, Shape, SpRun
from course_utils.kernel.launch.options import launches

SCRIPT = "17_long_context.py"
CONFIG = "17_long_context.json"
PROCS = 2                  # SP size = the launch's world size
FP32 = 4


@dataclass
class SpLaunch:
    """What one launch of the script measured."""
    reference: Reference | None
    shape: Shape | None
    head_rules: list
    runs: dict                # label → [SpRun of rank 0, rank 1, …]
    seconds: float
    growth: object = None     # with lengths grown under a limit: long_context_memory.SpOutcome


@launches(procs=PROCS, min_ranks=PROCS, env={"DS_ACCELERATOR": "cpu"})
def launch(runs: list[str], seq_len: int, steps: int, timeout: int, tutorial: str | None = None,
           yours: list[str] | None = None, reference: bool = True, grow: tuple[int, ...] = (), cap_mb: int = 0,
           quiet: bool = False) -> SpLaunch:
    """One launch of ``scripts/17_long_context.py`` on 2 CPU ranks (on any machine: its growth is compared with notebook
    17's other CPU launches): ``runs`` among "adapter", "tutorial", "yours"; with ``grow``, then those lengths under a
    limit of ``cap_mb`` MiB of tensors per rank until the limit ends the launch — that end is the measurement, not an
    error (:attr:`SpLaunch.growth`)."""
    from course_utils.kernel import hardware
    from course_utils.kernel import launch as runner
    from course_utils.common.records.long_context_memory import LengthRefused
    from course_utils.kernel.views import long_context_memory as memory

    args = ["--seq_len", seq_len, "--steps", steps, "--runs", *runs]
    args += ["--tutorial", tutorial] if tutorial else []
    args += ["--yours", *yours] if yours else []
    args += [] if reference else ["--no_reference"]
    args += ["--grow", *grow, "--cap_mb", cap_mb] if grow else []
    try:
        env = hardware.cpu_ranks_env(PROCS, gpu_machine=hardware.detect().is_gpu)
        result, error = runner.deepspeed(SCRIPT, *args, procs=PROCS, min_ranks=PROCS, config=CONFIG, env=env,
                                         timeout=timeout, quiet=quiet), None
    except runner.LaunchError as err:
        if not (grow and read_as(err.result.records, LengthRefused, rank=None)
                and read_as(err.result.records, SpRun, rank=None)):
            raise
        result, error = err.result, str(err)
    by_label: dict[str, list[SpRun]] = {}
    for r in sorted(read_as(result.records, SpRun, rank=None), key=lambda r: r.rank):
        by_label.setdefault(r.label, []).append(r)
    refs, shapes = read_as(result.records, Reference), read_as(result.records, Shape)
    growth = None
    if grow:
        growth = memory.outcome_of(PROCS, cap_mb, result.records, error, result.seconds)
    return SpLaunch(refs[0] if refs else None, shapes[0] if shapes else None, read_as(result.records, HeadRule),
                    by_label, result.seconds, growth)


def loss_gap(run: list[SpRun], reference: Reference) -> float:
    """The largest gap, over the steps, between a run's losses and the one-process reference's."""
    return max(abs(a - b) for a, b in zip(run[0].losses, reference.losses))


def norm_ratio(run: list[SpRun], reference: Reference) -> float:
    """The run's gradient norm over the reference's, at the step where they differ most from 1."""
    ratios = [a / b for a, b in zip(run[0].grad_norms, reference.grad_norms)]
    return max(ratios, key=lambda r: abs(r - 1))


def run_rows(launch: SpLaunch, reference: Reference | None = None) -> list[dict]:
    """One row per run and rank: the tokens it held, those with a label, and the run's losses beside the reference
    (``reference``, or the launch's own)."""
    reference = reference or launch.reference
    rows = []
    for label, ranks in launch.runs.items():
        for r in ranks:
            rows.append({"run": label, "rank": r.rank, "tokens held": r.local_tokens[0], "of": r.seq_len,
                         "tokens with a label": r.labelled[0], "first loss": round(r.losses[0], 6),
                         "last loss": round(r.losses[-1], 6),
                         "largest gap to one process": loss_gap(ranks, reference),
                         "gradient norm ÷ one process's": round(norm_ratio(ranks, reference), 6)})
    return rows


def tail(ranks: list[SpRun]) -> str:
    """Where the pieces meet in the first step: rank 0's last two labels, and the first two tokens of rank 1's piece."""
    return f"{ranks[0].edges['last_labels']} | rank 1 begins with {ranks[1].edges['first_ids']}"


def alltoall_formula(shape: Shape, seq_len: int, sp: int, dtype_bytes: int = FP32) -> dict[int, int]:
    """The messages of one training step's all-to-alls, {bytes: count}, from the model's shape, as
    ``UlyssesSPAttentionHF`` sends them (``deepspeed/runtime/sequence_parallel/ulysses_sp.py``): per layer and forward,
    query, key and value go from sequence shards to head shards (each message: this rank's L/sp tokens × its heads ×
    head_dim; key/value heads fewer than sp are first repeated to sp) and the attention's output comes back (L tokens ×
    heads/sp × head_dim); the backward sends the same messages again, the other way."""
    tokens = seq_len // sp
    kv = max(shape.kv_heads, sp)
    sizes = [tokens * shape.heads * shape.head_dim, tokens * kv * shape.head_dim, tokens * kv * shape.head_dim,
             seq_len * shape.heads // sp * shape.head_dim]
    out: dict[int, int] = {}
    for numel in sizes:
        out[numel * dtype_bytes] = out.get(numel * dtype_bytes, 0) + 2 * shape.layers
    return out


def alltoall_rows(launch: SpLaunch) -> list[dict]:
    """Per run: the all-to-all bytes of one step DeepSpeed's comms logger logged on rank 0, beside the formula."""
    rows = []
    for label, ranks in launch.runs.items():
        r = ranks[0]
        logged = {int(size): n for size, n in r.alltoall.items()}
        formula = alltoall_formula(launch.shape, r.seq_len, r.sp_size)
        rows.append({"run": label, "logged messages {bytes: count}": logged, "formula": formula,
                     "logged bytes": sum(s * n for s, n in logged.items()),
                     "formula bytes": sum(s * n for s, n in formula.items()),
                     "leave the rank": sum(s * n for s, n in logged.items()) * (r.sp_size - 1) // r.sp_size})
    return rows


def head_rows(launch: SpLaunch) -> list[dict]:
    return [{"query heads": h.heads, "key/value heads": h.kv_heads, "SP size": h.sp_size,
             "DeepSpeed": h.error or f"accepted: {h.local_q_heads} query and {h.local_kv_heads} key/value heads a rank"}
            for h in launch.head_rules]


# ---------------------------------------------------------------- the sharding exercise, judged in the kernel

def adapter_shards(launch: SpLaunch) -> list[dict]:
    """What DeepSpeed's adapter gave each rank for the first sample: {key: list of ints} per SP rank."""
    return [r.shards[0] for r in launch.runs["adapter"]]


def shard_problem(shard, seq_len: int, adapter: list[dict]) -> str | None:
    """What is wrong with a learner's ``shard(sample, sp_rank, sp_size)`` against DeepSpeed's adapter's shards of the
    same sample (None when it gives every rank exactly those)."""
    import torch

    from course_utils.rank.long_context import sample

    one = {k: v.unsqueeze(0) for k, v in sample(0, seq_len).items()}
    for sp_rank, theirs in enumerate(adapter):
        try:
            mine = shard({k: v.clone() for k, v in one.items()}, sp_rank, len(adapter))
        except Exception as e:                      # the learner's code: any error is their answer's
            return f"shard(sample, {sp_rank}, {len(adapter)}) raised {type(e).__name__}: {e}"
        for key, want in theirs.items():
            got = mine.get(key) if isinstance(mine, dict) else None
            if not torch.is_tensor(got):
                return f"shard(...) must return a dict with the tensors {sorted(theirs)}; {key!r} is missing"
            got = got.reshape(-1).tolist()
            if len(got) != len(want):
                return f"rank {sp_rank}'s {key} holds {len(got)} values, not the length of its piece of the sequence"
            wrong = [i for i, (a, b) in enumerate(zip(got, want)) if a != b]
            if wrong:
                return (f"rank {sp_rank}'s {key} differs from what the ranks must see at {len(wrong)} of its "
                        f"{len(want)} positions (the first at position {wrong[0]} of the piece)")
    return None


# ---------------------------------------------------------------- real scale, projected

PUBLISHED = ("Bekman et al., \"Arctic Long Sequence Training\" (arXiv 2506.13996, 2025), abstract: Llama 8B trained with "
             "sequences of 500K tokens on one H100, 3.7M on one 8×H100 node, over 15M on 4 nodes; 32K without ALST")


def llama8b_alltoall(setups: tuple[tuple[int, int], ...] = ((32_768, 8), (131_072, 8), (524_288, 8), (524_288, 32)),
                     gpu: str = "H100 80 GB", dtype_bytes: int = 2) -> list[dict]:
    """A Llama-3-8B shape (32 layers, 32 query and 8 key/value heads of 128), Ulysses over ``sp`` GPUs for each
    (sequence, sp) of ``setups`` — over NVLink inside a node of 8, over the network beyond — bf16: per GPU and step, the all-to-all bytes that leave it (:func:`alltoall_formula`, checked in section 3 against
    the comms logger) and its share of the FLOPs (the matmuls for its L/sp tokens, attention over the whole sequence
    for its heads), each projected on ``gpu`` at the course's MFU and link efficiency (course_utils.kernel.scale)."""
    from course_utils.kernel.scale import counts, models, project, specs

    spec = models.REAL_MODELS["Llama-3-8B shape"].config
    size = models.size("Llama-3-8B shape")
    shape = Shape(size.layers, spec["num_attention_heads"], spec["num_key_value_heads"],
                  spec["hidden_size"] // spec["num_attention_heads"])
    card = specs.gpu(gpu)
    rows = []
    for seq, sp in setups:
        link = card.gpu_link if sp <= 8 else specs.network()
        sent = sum(b * n for b, n in alltoall_formula(shape, seq, sp, dtype_bytes).items()) * (sp - 1) / sp
        flops = counts.step_flops(counts.forward_flops(size.matmul_params, seq / sp, size.layers, size.hidden, seq))
        wire = project.link_term("all-to-all", sent, link)
        compute = project.compute_term(flops, card)
        rows.append({"sequence": seq, "SP": sp, "all-to-all GB sent per GPU": sent / 1e9,
                     "projected all-to-all s": wire.seconds, "projected compute s": compute.seconds,
                     "all-to-all ÷ compute": wire.seconds / compute.seconds,
                     "rates": f"{wire.rate_says}; {compute.rate_says}"})
    return rows
