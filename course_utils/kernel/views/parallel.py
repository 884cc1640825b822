"""Notebook 13's tables and figures: the pipeline schedule and bubble, the bytes each axis sends, ZeRO++ hpZ, and
the decision table, read from the records of ``scripts/13_pipeline.py`` and ``scripts/13_zeropp.py``."""
from __future__ import annotations

import json
import statistics

from course_utils.common import paths
from course_utils.common.record import read_as
from course_utils.common.records.parallel import (Bubble, FromConfig, Gathers, StageBytes, StageStream, TensorParallel,
                                                  Ulysses)
from course_utils.rank import parallel as pp

from course_utils.kernel.views.source import show_script, show_source  # noqa: F401  (the notebook quotes DeepSpeed and the code its ranks run)


def schedule_table(m: int, p: int) -> list[dict]:
    """DeepSpeed's ``TrainSchedule`` for every stage, one row per step: what each stage is told to do."""
    streams = {s: pp.schedule(m, p, s) for s in range(p)}
    return [{"step": i, **{f"stage {s}": ", ".join(c.split("(")[0] + (f"({c.split('=')[1]}" if "=" in c else "")
                                                   for c in streams[s][i]) or "—" for s in range(p)}}
            for i in range(len(streams[0]))]


def _fill_and_drain(m: int, p: int) -> float:
    """The bubble of a synchronous pipeline with equal passes: (p − 1) / (m + p − 1) of a stage's time."""
    return (p - 1) / (m + p - 1)


def bubble_rows(records: list[dict]) -> list[dict]:
    """One row per m and stage: the idle share timed (median over the timed batches, and their spread), the idle
    steps of the executed schedule, the formula, each stage's median forward and backward pass of the last batch,
    the shares of the window this stage spent in its sends and its receives, and the last batch's gap to the formula
    split by :func:`replayed_idle`: ``uneven_compute`` is what a replay with the measured passes and free hand-overs
    idles beyond the formula, ``handovers`` the rest of the gap. The second is defined as the remainder, so the two
    add up to the gap by construction."""
    rows = []
    streams = {(s.m, s.stage): s for s in read_as(records, StageStream, rank=None)}
    replayed = {m: replayed_idle(records, m) for m in {b.m for b in read_as(records, Bubble, rank=None)}}
    for b in read_as(records, Bubble, rank=None):
        sends = sum(ms for name, ms in b.by_instruction.items() if name.startswith("Send"))
        receives = sum(ms for name, ms in b.by_instruction.items() if name.startswith("Recv"))
        formula, last = _fill_and_drain(b.m, b.stages), b.shares[-1]
        passes = _pass_times(streams[(b.m, b.stage)])
        rows.append({"m": b.m, "stage": b.stage, "idle_share": b.idle_share, "spread": max(b.shares) - min(b.shares),
                     "idle_steps": f"{b.idle_steps}/{b.steps}", "step_share": b.idle_steps / b.steps, "formula": formula,
                     "uneven_compute": replayed[b.m][b.stage] - formula, "handovers": last - replayed[b.m][b.stage],
                     "forward_ms": passes["ForwardPass"], "backward_ms": passes["BackwardPass"],
                     "send_share": sends / b.window_ms, "recv_share": receives / b.window_ms,
                     "busy_ms": b.busy_ms, "window_ms": b.window_ms, "in_flight": b.in_flight})
    return sorted(rows, key=lambda r: (r["m"], r["stage"]))


def _pass_times(stream: StageStream) -> dict[str, float]:
    """Median milliseconds of one forward and of one backward pass in the stream a stage executed."""
    names = [c.split("(")[0] for step in stream.executed for c in step]
    return {kind: statistics.median(ms for name, ms in zip(names, stream.durations) if name == kind)
            for kind in ("ForwardPass", "BackwardPass")}


def pipeline_idle(records: list[dict]) -> list[dict]:
    """One row per m: the idle share of the two stages together (their mean in each timed batch; the median, lowest
    and highest over the batches) against the formula. It is steadier than either stage's share: which stage waits
    for the other changes from run to run, the waiting itself much less."""
    by_m: dict[int, list] = {}
    for b in read_as(records, Bubble, rank=None):
        by_m.setdefault(b.m, []).append(b)
    rows = []
    for m, stages in sorted(by_m.items()):
        both = [statistics.fmean(shares) for shares in zip(*(b.shares for b in stages))]
        formula = _fill_and_drain(m, stages[0].stages)
        rows.append({"m": m, "idle_share": statistics.median(both), "lowest": min(both), "highest": max(both),
                     "formula": formula, "above_formula": statistics.median(both) - formula})
    return rows


def one_f_one_b(m: int, p: int, stage: int) -> str:
    """The order of forward (F) and backward (B) passes of ``stage`` in 1F1B as Narayanan et al. (2021) describe it
    (PipeDream-Flush): p − stage − 1 forwards to fill the pipe (at most m), then one forward and one backward in turn,
    then the backwards left. Written from that description, not from DeepSpeed's schedule."""
    warm = min(p - stage - 1, m)
    return "F" * warm + "FB" * (m - warm) + "B" * warm


def order_rows(records: list[dict], p: int = 2) -> list[dict]:
    """Per m and stage: the forward and backward passes the stage executed (as instrumented), in order, next to 1F1B."""
    rows = []
    for s in read_as(records, StageStream, rank=None):
        ran = "".join(c[0] for step in s.executed for c in step if c.split("(")[0] in ("ForwardPass", "BackwardPass"))
        rows.append({"m": s.m, "stage": s.stage, "executed": ran, "1F1B": one_f_one_b(s.m, p, s.stage)})
    return sorted(rows, key=lambda r: (r["m"], r["stage"]))


# Exercise 1's check asks the learner's function about these pipelines too, one rank per stage; nothing else shows them
UNSEEN = (({"train_batch_size": 40, "train_micro_batch_size_per_gpu": 8}, 3, 3),
          ({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8}, 4, 4))


def bubble_cases(cases=UNSEEN) -> list[tuple[tuple, float]]:
    """For each (config, ranks, stages) with one rank per stage: the share of the steps in which a stage runs no
    ForwardPass or BackwardPass, for the micro-batches DeepSpeed's config class derives from the config's batch keys
    (in this kernel, without a process group, it counts one data-parallel rank: what one rank per stage has), counted
    in a fresh ``TrainSchedule`` on every stage (they agree; if they did not, there would be no single answer)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    out = []
    for config, ranks, p in cases:
        if ranks != p:
            raise ValueError(f"{config} on {ranks} ranks: these cases have one rank per stage ({p})")
        derived = DeepSpeedConfig(dict(config))
        if derived.world_size != 1:
            raise RuntimeError("DeepSpeed's config class counted more than one data-parallel rank in this kernel")
        m = derived.gradient_accumulation_steps
        shares = {sum(1 for step in steps if not any(c.startswith(("ForwardPass", "BackwardPass")) for c in step))
                  / len(steps) for steps in (pp.schedule(m, p, s) for s in range(p))}
        if len(shares) != 1:
            raise RuntimeError(f"TrainSchedule idles different shares on different stages for m={m}, p={p}: {shares}")
        out.append(((config, ranks, p), shares.pop()))
    return out


def from_config_runs(*record_sets: list[dict]) -> dict[int, dict]:
    """Exercise 1's pipeline as each launch ran it, by its number of ranks: the micro-batches DeepSpeed derived and the
    share of schedule steps a stage ran no forward or backward pass in (the same on every stage and replica)."""
    runs: dict[int, dict] = {}
    for records in record_sets:
        rows = read_as(records, FromConfig, rank=None)
        for ranks in {r.ranks for r in rows}:
            mine = [r for r in rows if r.ranks == ranks]
            shares = {r.idle_steps / r.steps for r in mine}
            if len(shares) != 1:
                raise RuntimeError(f"exercise 1's pipeline idled different shares on its {ranks} ranks: {shares}")
            runs[ranks] = {"m": mine[0].m, "data_parallel": mine[0].data_parallel, "share": shares.pop(),
                           "idle_steps": f"{mine[0].idle_steps}/{mine[0].steps}"}
    return runs


def replayed_idle(records: list[dict], m: int) -> dict[int, float]:
    """Each stage's idle share if hand-overs cost nothing: the streams the stages executed for ``m`` micro-batches,
    replayed with their measured forward and backward times, a send taking no time and a receive waiting only for
    the matching send of the neighbour (the k-th ``SendActivation`` feeds the k-th ``RecvActivation``, likewise for
    gradients). The window ends, as measured, with the last forward or backward of any stage."""
    streams = {s.stage: s for s in read_as(records, StageStream, rank=None) if s.m == m}
    todo = {st: list(zip([c.split("(")[0] for step in s.executed for c in step], s.durations))
            for st, s in streams.items()}
    feeds = {"RecvActivation": "SendActivation", "RecvGrad": "SendGrad"}
    sent: dict[tuple, list] = {}
    clock, at, busy, end = {st: 0.0 for st in todo}, {st: 0 for st in todo}, {st: 0.0 for st in todo}, 0.0
    while any(at[st] < len(todo[st]) for st in todo):
        moved = False
        for st in todo:
            while at[st] < len(todo[st]):
                name, ms = todo[st][at[st]]
                if name in feeds:
                    times = sent.get((feeds[name], st), [])
                    if not times:
                        break
                    clock[st] = max(clock[st], times.pop(0))
                elif name.startswith("Send"):
                    sent.setdefault((name, st + (1 if name == "SendActivation" else -1)), []).append(clock[st])
                elif name in ("ForwardPass", "BackwardPass"):
                    clock[st] += ms
                    busy[st] += ms
                    end = max(end, clock[st])
                at[st] += 1
                moved = True
        if not moved:
            raise RuntimeError("the streams wait on each other: not a pipeline schedule")
    return {st: 1 - busy[st] / end for st in todo}


def plot_bubble(stage_rows: list[dict], both: list[dict]):
    """Measured idle share against (p − 1)/(m + p − 1): each stage's median, and the two stages together with the
    range over the timed batches."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ms = [r["m"] for r in both]
    ax.plot(ms, [r["formula"] for r in both], "k--", label="(p−1)/(m+p−1)")
    for stage in sorted({r["stage"] for r in stage_rows}):
        mine = [r for r in stage_rows if r["stage"] == stage]
        ax.plot([r["m"] for r in mine], [r["idle_share"] for r in mine], "o", alpha=0.6, label=f"stage {stage}")
    ax.errorbar(ms, [r["idle_share"] for r in both],
                yerr=[[r["idle_share"] - r["lowest"] for r in both], [r["highest"] - r["idle_share"] for r in both]],
                fmt="s-", color="C3", capsize=3, label="both stages (range over batches)")
    ax.set(xscale="log", xticks=ms, xticklabels=ms, xlabel="micro-batches m", ylabel="idle share of the window")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def p2p_rows(records: list[dict]) -> list[dict]:
    """Bytes each stage sent per ``train_batch`` against m × micro-batch × width × bytes per element."""
    rows = []
    for s in read_as(records, StageBytes, rank=None):
        micro, width = s.activation_shape
        rows.append({"m": s.m, "stage": s.stage, **{k: v for k, v in s.sent.items()},
                     "formula": s.m * micro * width * s.element_bytes})
    return sorted(rows, key=lambda r: (r["m"], r["stage"]))


def ulysses_rows(*record_sets: list[dict]) -> list[dict]:
    """Ulysses on each launch's ranks: the largest gap to one-rank attention over every rank, and rank 0's
    all-to-all bytes against 4 × batch × sequence × hidden × bytes / p per pass."""
    rows = []
    for records in record_sets:
        every = read_as(records, Ulysses, rank=None)
        u = every[0]
        b, s, h, d = u.shape
        rows.append({"p": u.p, "max_abs_diff": max(x.max_abs_diff for x in every), "local_attention_sees": u.local_shape,
                     "forward_bytes": sum(int(k) * n for k, n in u.forward_alltoall.items()),
                     "backward_bytes": sum(int(k) * n for k, n in u.backward_alltoall.items()),
                     "formula": 4 * b * s * h * d * u.element_bytes // u.p,
                     "all_to_alls": sum(u.forward_alltoall.values())})
    return rows


def autotp_rows(records: list[dict]) -> list[dict]:
    return [{"model": t.model, "ran": not t.error, "weights split": len(t.split), "kept whole": len(t.kept),
             "rank bytes / whole": round(t.rank_bytes / t.whole_bytes, 3) if t.rank_bytes else None,
             "logits max |diff|": t.max_abs_diff if not t.error else None, "DeepSpeed said": t.error.strip().splitlines()[0] if t.error else ""}
            for t in read_as(records, TensorParallel)]


def hpz_rows(records: list[dict]) -> list[dict]:
    """Rank 0's all-gather bytes of one forward and backward, by where they come from, with and without hpZ."""
    return [{"run": g.label, "from own node": g.intra_node, "from other node": g.inter_node,
             "intra-node share": round(g.intra_node / (g.intra_node + g.inter_node), 4),
             "by group size": g.by_group_size} for g in read_as(records, Gathers)]


def hpz_formula(n: int, per_node: int, group: int) -> dict:
    """Shares of the bytes a rank receives in ZeRO-3's parameter all-gathers (one forward and one backward) that come
    from its own node. A gather over all N ranks brings it (N − 1)/N of the parameters Ψ, (n − 1)/N from the n − 1
    other ranks of its node: (n − 1)/(N − 1) of what it receives stays inside the node, (N − n)/(N − 1) crosses. hpZ's
    backward gathers over ``group`` ranks of the node: (g − 1)/g of Ψ, all from inside."""
    own, other = (per_node - 1) / n, (n - per_node) / n      # fractions of Ψ, one gather over all N ranks
    backward_own = (group - 1) / group
    return {"ZeRO-3": own / (own + other), "hpZ": (own + backward_own) / (own + other + backward_own)}


def zero_traffic_from_03() -> dict | None:
    """What each rank sent per step at ZeRO stages 1 and 2, as a multiple of stage 0's, as notebook 03 measured it
    (fp32, the fewest ranks it ran; its comms-logger bytes turned into ring traffic as notebook 03 does): read from
    ``build/metrics/03_zero_stages.json``; None when notebook 03 has not run on this machine."""
    from course_utils.kernel.views.zero import RING_FACTOR

    path = paths.metrics_dir() / "03_zero_stages.json"
    if not path.exists():
        return None
    sent: dict[tuple, float] = {}
    for r in json.loads(path.read_text()).get("comm", []):
        if r["dtype"] == "fp32" and r["run"] == f"stage {r['stage']}" and r["collective"] in RING_FACTOR:
            key = (r["world_size"], r["stage"])
            sent[key] = sent.get(key, 0.0) + r["logged_bytes"] * RING_FACTOR[r["collective"]](r["world_size"])
    sizes = [n for n, stage in sent if stage == 0 and sent[(n, 0)] and (n, 1) in sent and (n, 2) in sent]
    if not sizes:
        return None
    n = min(sizes)
    return {"ranks": n, 1: sent[(n, 1)] / sent[(n, 0)], 2: sent[(n, 2)] / sent[(n, 0)]}


DECISION = [
    ("data parallel (ZeRO-0)", "16Ψ", "all-reduce 2Ψ", "the model and its states fit one device"),
    ("ZeRO-1", "4Ψ + 12Ψ/N", "2Ψ (published: reduce-scatter + all-gather)", "optimizer states are the excess"),
    ("ZeRO-2", "2Ψ + 14Ψ/N", "2Ψ (published)", "gradients do not fit either"),
    ("ZeRO-3 / FSDP2 (fully_shard)", "16Ψ/N", "3Ψ (gather forward and backward, reduce-scatter)",
     "the weights themselves do not fit one device"),
    ("+ offload (optimizer to CPU)", "device: 16-bit weights 2Ψ (ZeRO-2); host: optimizer states 12Ψ/N",
     "+ gradients down, 16-bit weights up: 4Ψ/N over PCIe", "devices are few and host memory large"),
    ("pipeline, p stages", "16Ψ/p + min(p−s, m) micro-batches' activations",
     "2·m·b·s·h between neighbours; bubble (p−1)/(m+p−1)", "slow links between nodes; many layers"),
    ("tensor (AutoTP / Megatron), t ranks", "16Ψ/t for the split weights", "2 all-reduces of b·s·h per layer and pass",
     "one layer does not fit; fast links (inside a node)"),
    ("sequence (Ulysses), p ranks", "activations / p (states: combine with ZeRO)", "4 all-to-alls of b·s·h/p per layer and pass",
     "long sequences; at least p key-value heads"),
    ("ZeRO++ (hpZ + qwZ + qgZ)", "ZeRO-3 + a secondary shard 2Ψ/g", "cross-node 0.75Ψ instead of 3Ψ (published)",
     "ZeRO-3 across nodes on slow links"),
    ("expert parallel (MoE), ep ranks", "experts: 16Ψ_experts/ep (ZeRO-1/2 split them further over N/ep); the rest as "
     "its ZeRO stage", "2 all-to-alls of E·C·h per MoE layer and pass, (ep−1)/ep of them leave the rank",
     "a Mixture-of-Experts model whose experts do not fit one device"),
    ("long context (ALST: Ulysses for HF models + tiling), p ranks", "activations / p, but every rank keeps whole "
     "what does not split by token (ZeRO-3's gathered layer, key/value heads repeated when fewer than p)",
     "4 all-to-alls of (L/p)·heads·d_head per layer and pass, (p−1)/p of them leave the rank",
     "one sequence's activations do not fit one device; p divides the query heads, and the key/value heads divide p "
     "or p divides them"),
]

# What later notebooks teach: where each measures its row, named here without a figure from a run the learner has not
# done yet (13 stands on its own runs and on the notebooks before it)
LATER = {
    "+ offload (optimizer to CPU)": "later: 16 · Bigger than your device, section 3, trains a model whose states exceed "
                                    "a memory limit you set, with ZeRO-3 and CPU or NVMe offload",
    "expert parallel (MoE), ep ranks": "later: 15 · Mixture of Experts, sections 2 and 4, measure which experts each rank "
                                       "holds, the all-to-all bytes, and the losses against ep_size 1",
    "long context (ALST: Ulysses for HF models + tiling), p ranks": "later: 17 · Long context, sections 3 and 4, measure "
                                                                    "the loss against one process and the longest "
                                                                    "sequence under a memory limit per SP size",
}


def decision_table(measured: dict[str, str]) -> list[dict]:
    """The decision table: memory and communication per rank and step (Ψ parameters in mixed-precision Adam, N
    ranks), the question that picks it, and what this notebook and the ones before it measured (``measured``:
    approach → text), followed by where a later notebook measures it (:data:`LATER`)."""
    return [{"approach": a, "memory per rank (bytes)": mem, "communication per step": comm, "choose when": ask,
             "measured in the course": "; ".join(t for t in (measured.get(a, ""), LATER.get(a, "")) if t)}
            for a, mem, comm, ask in DECISION]
