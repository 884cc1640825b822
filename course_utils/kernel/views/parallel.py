"""Notebook 13's tables and figures: the pipeline schedule and bubble, the bytes each axis sends, ZeRO++ hpZ, and
the decision table, read from the records of ``scripts/13_pipeline.py`` and ``scripts/13_zeropp.py``."""
from __future__ import annotations

from course_utils.common.record import read_as
from course_utils.common.records.parallel import Bubble, Gathers, StageBytes, StageStream, TensorParallel, Ulysses
from course_utils.rank import parallel as pp

from course_utils.kernel.views.source import show_source  # noqa: F401  (the notebook quotes DeepSpeed's pipeline engine with it)


def schedule_table(m: int, p: int) -> list[dict]:
    """DeepSpeed's ``TrainSchedule`` for every stage, one row per step: what each stage is told to do."""
    streams = {s: pp.schedule(m, p, s) for s in range(p)}
    return [{"step": i, **{f"stage {s}": ", ".join(c.split("(")[0] + (f"({c.split('=')[1]}" if "=" in c else "")
                                                   for c in streams[s][i]) or "—" for s in range(p)}}
            for i in range(len(streams[0]))]


def bubble_rows(records: list[dict]) -> list[dict]:
    """One row per m and stage: the idle share timed, the idle steps of the executed schedule, the formula, the
    last batch's gap to the formula in two measured parts (:func:`replayed_idle`): what the stages' unequal forward
    and backward times make of the bubble, and what the hand-overs add; and the shares of the window this stage
    spent in its sends and its receives."""
    rows = []
    replayed = {m: replayed_idle(records, m) for m in {b.m for b in read_as(records, Bubble, rank=None)}}
    for b in read_as(records, Bubble, rank=None):
        sends = sum(ms for name, ms in b.by_instruction.items() if name.startswith("Send"))
        receives = sum(ms for name, ms in b.by_instruction.items() if name.startswith("Recv"))
        rows.append({"m": b.m, "stage": b.stage, "idle_share": b.idle_share, "last_share": b.last_share,
                     "idle_steps": f"{b.idle_steps}/{b.steps}",
                     "step_share": b.idle_steps / b.steps, "formula": b.formula, "gap": b.idle_share - b.formula,
                     "uneven_compute": replayed[b.m][b.stage] - b.formula,
                     "handovers": b.last_share - replayed[b.m][b.stage],
                     "send_share": sends / b.window_ms, "recv_share": receives / b.window_ms, "busy_ms": b.busy_ms, "window_ms": b.window_ms,
                     "in_flight": b.in_flight})
    return sorted(rows, key=lambda r: (r["m"], r["stage"]))


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


def plot_bubble(rows: list[dict]):
    """Measured idle share per stage against (p − 1)/(m + p − 1)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    ms = sorted({r["m"] for r in rows})
    ax.plot(ms, [next(r["formula"] for r in rows if r["m"] == m) for m in ms], "k--", label="(p−1)/(m+p−1)")
    for stage in sorted({r["stage"] for r in rows}):
        mine = [r for r in rows if r["stage"] == stage]
        ax.plot([r["m"] for r in mine], [r["idle_share"] for r in mine], "o-", label=f"stage {stage}, measured")
    ax.set(xscale="log", xticks=ms, xticklabels=ms, xlabel="micro-batches m", ylabel="idle share of the window")
    ax.legend()
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
             "logits max |diff|": t.max_abs_diff if not t.error else None, "DeepSpeed said": t.error[:90]}
            for t in read_as(records, TensorParallel)]


def hpz_rows(records: list[dict]) -> list[dict]:
    """Rank 0's all-gather bytes of one forward and backward, by where they come from, with and without hpZ."""
    return [{"run": g.label, "from own node": g.intra_node, "from other node": g.inter_node,
             "intra-node share": round(g.intra_node / (g.intra_node + g.inter_node), 4),
             "by group size": g.by_group_size} for g in read_as(records, Gathers)]


def hpz_formula(n: int, per_node: int, group: int) -> dict:
    """Shares of the gathered bytes that come from the own node (fractions of the whole parameter set Ψ each
    gather rebuilds): ZeRO-3 gathers over all N ranks in forward and in backward; hpZ's backward gathers over
    its group of ``group`` ranks inside a node."""
    own, other = (per_node - 1) / n, (n - per_node) / n
    plain = own / (own + other)
    backward_own = (group - 1) / group
    hpz = (own + backward_own) / (own + other + backward_own)
    return {"ZeRO-3": plain, "hpZ": hpz}


DECISION = [
    ("data parallel (ZeRO-0)", "16Ψ", "all-reduce 2Ψ", "the model and its states fit one device"),
    ("ZeRO-1", "4Ψ + 12Ψ/N", "2Ψ (reduce-scatter + all-gather)", "optimizer states are the excess"),
    ("ZeRO-2", "2Ψ + 14Ψ/N", "2Ψ", "gradients do not fit either"),
    ("ZeRO-3 / FSDP2 (fully_shard)", "16Ψ/N", "3Ψ (gather forward and backward, reduce-scatter)",
     "the weights themselves do not fit one device"),
    ("+ offload (optimizer to CPU)", "device: 16-bit weights 2Ψ (ZeRO-2); host: optimizer states 12Ψ/N",
     "+ gradients down, 16-bit weights up: 4Ψ/N over PCIe", "devices are few and host memory large"),
    ("pipeline, p stages", "16Ψ/p + min(p−s, m) micro-batches' activations",
     "2·m·b·s·h between neighbours; bubble (p−1)/(m+p−1)", "slow links between nodes; many layers"),
    ("tensor (AutoTP / Megatron), t ranks", "16Ψ/t for the split weights", "2 all-reduces of b·s·h per layer and pass",
     "one layer does not fit; fast links (inside a node)"),
    ("sequence (Ulysses), p ranks", "activations / p (states: combine with ZeRO)", "4 all-to-alls of b·s·h/p per layer and pass",
     "long sequences; heads divisible by p"),
    ("ZeRO++ (hpZ + qwZ + qgZ)", "ZeRO-3 + a secondary shard 2Ψ/g", "cross-node 0.75Ψ instead of 3Ψ (published)",
     "ZeRO-3 across nodes on slow links"),
]


def decision_table(measured: dict[str, str]) -> list[dict]:
    """The decision table: memory and communication per rank and step (Ψ parameters in mixed-precision Adam, N
    ranks), the question that picks it, and what this course measured (``measured``: approach → text)."""
    return [{"approach": a, "memory per rank (bytes)": mem, "communication per step": comm, "choose when": ask,
             "measured in the course": measured.get(a, "")} for a, mem, comm, ask in DECISION]
