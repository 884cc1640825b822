"""Notebook 01's tables and figures: the collectives of every rank, the collectives ZeRO calls, the
parallelism families, the ring all-reduce step by step, all_reduce timing, a launch over ssh."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from course_utils.kernel.launch.commands import ENV_FILE
from course_utils.common.records.collectives import (COLLECTIVES, AllReduceTime, CollectiveRow, Identity, RingStep,
    TimingLoad, ZeroCollectives)
from course_utils.common.record import read_as


def collectives_table(records: list[dict]):
    """The ``collectives`` rows of every rank of a launch → a DataFrame indexed by (collective, rank),
    in the order they ran."""
    import pandas as pd

    df = pd.DataFrame(read_as(records, CollectiveRow, rank=None))
    df["collective"] = pd.Categorical(df["collective"], COLLECTIVES, ordered=True)
    return df.sort_values(["collective", "rank"]).set_index(["collective", "rank"])


def pdsh_command(log: str, width: int = 110, longest: int = 96) -> str:
    """The command DeepSpeed's pdsh runner ran (its ``cmd = pdsh ...`` log line), one shell statement a line (wrapped
    at ``width``), words over ``longest`` characters shortened: pdsh and its hosts, the ``export``s, the ``cd``, the
    node launcher with its arguments."""
    import textwrap

    line = next(line for line in log.splitlines() if "cmd = pdsh " in line)
    head, rest = re.match(r"(pdsh .*?-w \S+) (.*)", line.split("cmd = ", 1)[1]).groups()
    short = lambda word: word if len(word) <= longest else word[:longest - 1] + "…"
    statements = [" ".join(map(short, s.split())) for s in re.split(r"(?<=;) ", rest) if s.strip()]
    return "\n".join([head, *(textwrap.fill(s, width, initial_indent="    ", subsequent_indent="        ",
                                            break_long_words=False, break_on_hyphens=False) for s in statements)])


def ssh_launch_table(result):
    """A launch over ssh, from its run folder and log: prints its hostfile, its ``.deepspeed_env`` and the command
    DeepSpeed's runner gave pdsh; returns one row per rank: who it is, the host ssh reached it at (sshd's
    ``SSH_CONNECTION``), its host name, and its all_reduce tensor before and after."""
    import pandas as pd

    print(f"hostfile:\n{(result.run_dir / 'hostfile').read_text()}")
    print(f"{ENV_FILE} (the run's, named by DS_ENV_FILE):\n{(result.run_dir / ENV_FILE).read_text()}")
    print(f"what DeepSpeed's runner ran (long values shortened):\n{pdsh_command(result.log)}\n")
    reduced = {r.rank: r for r in read_as(result.records, CollectiveRow, rank=None) if r.collective == "all_reduce"}
    return pd.DataFrame([{"rank": i.rank, "node_rank": i.node_rank, "ssh_host": i.ssh_host, "host name": i.host,
                          "pid": i.pid, "master": f"{i.master_addr}:{i.master_port}",
                          "all_reduce before": reduced[i.rank].before, "all_reduce after": reduced[i.rank].after}
                         for i in read_as(result.records, Identity, rank=None)]).set_index("rank")


def plot_parallelism_families():
    """Four panels: how data, tensor (model) and pipeline parallelism split a 4-layer model over
    devices, and how 3D parallelism combines them; ZeRO marked as data parallelism whose
    parameters, gradients and optimizer states are partitioned instead of replicated."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b2", "#937860", "#da8bc3", "#8c8c8c"]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.2))
    layers = 4

    def model(ax, x0, y0, w, h, owner: Callable[[int, int], int], label: str, hatch_fn=None) -> None:
        """A model drawn as `layers` rows of 2 halves; owner(layer, half) gives the device colour."""
        for layer in range(layers):
            for half in range(2):
                dev = owner(layer, half)
                ax.add_patch(Rectangle((x0 + half * w / 2, y0 + (layers - 1 - layer) * h / layers), w / 2, h / layers,
                                       facecolor=colors[dev % len(colors)], edgecolor="white", lw=1.5,
                                       hatch=hatch_fn(layer, half) if hatch_fn else None))
        ax.text(x0 + w / 2, y0 - 0.06, label, ha="center", va="top", fontsize=9)

    def frame(ax, title: str, note: str) -> None:
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.25, 1.05)
        ax.axis("off")
        ax.set_title(title, fontsize=11)
        ax.text(0.5, -0.22, note, ha="center", va="bottom", fontsize=8.5, wrap=True)

    ax = axes[0]
    for d in range(2):
        model(ax, 0.08 + d * 0.46, 0.12, 0.38, 0.8, lambda l, h, d=d: d, f"device {d}: full copy\nbatch shard {d}")
    frame(ax, "Data parallel (DDP; ZeRO)", "same model everywhere, different data;\ngradients all_reduced. "
          "ZeRO: each device\nkeeps only 1/N of params/grads/optimizer")
    ax = axes[1]
    model(ax, 0.3, 0.12, 0.4, 0.8, lambda l, h: h, "each layer's matrices\nsplit in halves: dev 0 | dev 1")
    frame(ax, "Tensor (model) parallel", "every layer split across devices;\nactivations all_reduced "
          "inside each layer")
    ax = axes[2]
    model(ax, 0.3, 0.12, 0.4, 0.8, lambda l, h: l // 2, "layers 0-1: dev 0\nlayers 2-3: dev 1")
    frame(ax, "Pipeline parallel", "consecutive layers on different devices;\nmicro-batches flow "
          "stage to stage (send/recv)")
    ax = axes[3]
    for d in range(2):
        model(ax, 0.08 + d * 0.46, 0.12, 0.38, 0.8, lambda l, h, d=d: 4 * d + 2 * (l // 2) + h,
              f"replica {d}: 4 devices\n(2 stages × 2 tensor)")
    frame(ax, "3D = data × pipeline × tensor", "here 2 × 2 × 2 = 8 devices (colours);\nDeepSpeed: ZeRO-1 "
          "data parallel + pipeline\n+ Megatron-style tensor parallel")
    fig.tight_layout()
    return fig


def plot_all_reduce_times(rows: list[AllReduceTime], world_size: int, backend: str):
    """all_reduce time and algorithm bandwidth against message size (log-log)."""
    import matplotlib.pyplot as plt

    sizes = [r.bytes for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    a.loglog(sizes, [1e3 * r.seconds for r in rows], "o-")
    a.set_xlabel("message size (bytes)")
    a.set_ylabel("all_reduce time (ms, median)")
    a.set_title(f"all_reduce on {world_size} ranks ({backend})")
    b.semilogx(sizes, [r.gbytes_per_s for r in rows], "o-", color="C1")
    b.set_xlabel("message size (bytes)")
    b.set_ylabel("size / time (GB/s)")
    b.set_title("small messages: latency-bound; large: bandwidth-bound")
    for ax in (a, b):
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def fit_alpha_beta(rows: list[AllReduceTime]) -> tuple[float, float]:
    """Fit seconds = α + β · bytes to all_reduce timings: α the latency per call (s), β the seconds per byte. Least
    squares on relative errors (weights 1/seconds), so that the small messages, which decide α, count as much as the
    large ones. Below α/β bytes a call costs mostly its latency, above mostly its bytes."""
    import numpy as np

    seconds = np.array([r.seconds for r in rows])
    beta, alpha = np.polyfit([r.bytes for r in rows], seconds, 1, w=1 / seconds)
    return float(alpha), float(beta)


def timing_load(records: list[dict]) -> dict:
    """What else the machine ran while the ranks timed all_reduce (the ``timing_load`` records of
    scripts/01_collectives.py): CPU seconds of the ranks, of every other process, and the cores those took."""
    loads = read_as(records, TimingLoad, rank=None)
    first = min(loads, key=lambda r: r.rank)          # rank 0's window stands for the launch (one machine)
    ranks_cpu = sum(r.own_cpu_s for r in loads)
    others = max(0.0, first.machine_busy_s - ranks_cpu)
    return {"wall_s": first.wall_s, "cores": first.cores, "ranks_cpu_s": ranks_cpu, "others_cpu_s": others,
            "others_cores": others / first.wall_s if first.wall_s > 0 else 0.0}


def zero_collectives_table(records: list[dict], rank: int = 0):
    """The ``zero_collectives`` records of one rank → a DataFrame: one row per (ZeRO stage, phase of the
    step), one column per collective DeepSpeed's comms logger saw, the number of calls in the cells."""
    import pandas as pd

    rows = [{"stage": r.stage, "phase": r.phase, **r.calls} for r in read_as(records, ZeroCollectives, rank)]
    return pd.DataFrame(rows).set_index(["stage", "phase"]).fillna(0).astype(int)


def show_collective_calls() -> None:
    """Print the lines of :func:`course_utils.rank.distributed.run_collectives` that call a collective, numbered as in
    its file: what the ranks ran for section 5's tables, quoted from the function they import, not copied."""
    import inspect

    from course_utils.common import paths
    from course_utils.rank import distributed

    lines, first = inspect.getsourcelines(distributed.run_collectives)
    print(f"{paths.relative(Path(inspect.getsourcefile(distributed.run_collectives)))}, run_collectives:")
    previous = None
    for number, line in enumerate(lines, first):
        if "dist." in line or "reduce_scatter(t)" in line:
            if previous is not None and number != previous + 1:
                print("        ⋮")
            print(f"  {number:5d} | {line.rstrip()}")
            previous = number


def contributors(value: float | None, world_size: int) -> list[int] | None:
    """The ranks whose contributions a traced ring value holds (rank r added 2**r), or None when the
    value is not such a sum (a ring that added something twice, say)."""
    if value is None or value != int(value) or not 0 <= value < 2 ** world_size:
        return None
    return [r for r in range(world_size) if int(value) >> r & 1]


def plot_ring_steps(steps: list[RingStep], world_size: int):
    """The ring all-reduce the ranks ran, step by step: one row per rank, one column per step (what the
    rank held after it), each rank's chunks as boxes coloured by how many ranks' contributions they hold
    and labelled with those ranks. The chunk a rank sent in that step has an arrow to the rank it went
    to; the chunk its received message changed has a red frame."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    by = {(s.rank, s.step): s for s in steps}
    ranks = sorted({s.rank for s in steps})
    last = max(s.step for s in steps)
    cmap = plt.get_cmap("YlGnBu")
    width, gap = 0.36, 0.45
    fig, ax = plt.subplots(figsize=(1.4 + 1.8 * (last + 1), 1.0 + 0.95 * len(ranks)))
    for k in range(last + 1):
        x0 = k * (world_size * width + gap)
        phase = ("\nscatter-reduce" if k < world_size else "\nall-gather") if last == 2 * (world_size - 1) else ""
        ax.text(x0 + world_size * width / 2, len(ranks) + 0.15, "start" if k == 0 else f"step {k}{phase}",
                ha="center", va="bottom", fontsize=8)
        for row, r in enumerate(ranks):
            s, before = by.get((r, k)), by.get((r, k - 1))
            if s is None:
                continue
            y = len(ranks) - 1 - row
            for c, value in enumerate(s.held):
                who = contributors(value, world_size)
                changed = before is not None and before.held[c] != value
                ax.add_patch(Rectangle((x0 + c * width, y + 0.1), width, 0.7,
                                       facecolor=cmap(0.15 + 0.85 * len(who) / world_size) if who else "#f4a6a6",
                                       edgecolor="#d62728" if changed else "white", lw=2.4 if changed else 1))
                ax.text(x0 + (c + 0.5) * width, y + 0.45, "".join(map(str, who)) if who else "?", ha="center",
                        va="center", fontsize=7, color="white" if who and len(who) > world_size / 2 else "black")
                if c == s.sent_chunk:
                    ax.text(x0 + (c + 0.5) * width, y + 0.83, f"→{s.sent_to}", ha="center", va="bottom",
                            fontsize=7, color="#d95f02", fontweight="bold")
            if k == 0:
                ax.text(x0 - 0.1, y + 0.45, f"rank {r}", ha="right", va="center", fontsize=9)
    ax.set_xlim(-0.9, (last + 1) * (world_size * width + gap))
    ax.set_ylim(0, len(ranks) + 0.75)
    ax.axis("off")
    ax.set_title(f"Ring all-reduce on {world_size} ranks, as the ranks ran it. A box is one chunk, labelled with the "
                 "ranks whose data it holds;\n→n: the chunk this rank sent to rank n in that step; red frame: the "
                 "chunk the message it received changed", fontsize=9)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- exercise 1: predict, with the measurements out of reach

PREDICTED = ("broadcast", "all_reduce", "reduce_scatter", "all_gather")


def predict_problem(predict: Callable, launches: list, hint) -> tuple[str, int]:
    """Exercise 1: ``predict(collective, rank, world_size)`` against every rank's list after each collective, as
    ``launches`` (the 2- and the 4-rank one) recorded it. The function is called while the launches' results and the
    tables built from them are out of its reach (:func:`checks.out_of_reach`). Returns what is wrong ("" when nothing is) and
    the world size of the case that showed it, for the hint; never the expected lists."""
    from course_utils.kernel import checks

    cases = []
    for launch in launches:
        table = collectives_table(launch.records)
        cases += [((c, int(r), len(table.loc[c])), list(table.loc[(c, r), "after"]))
                  for c in PREDICTED for r in table.loc[c].index]
    with checks.out_of_reach(predict) as hidden:
        for args, want in cases:
            try:
                got = checks.solution(predict, *args, hint=hint)
            except checks.ExerciseCheckError:
                raise
            except Exception as err:      # noqa: BLE001 — a lookup of a hidden table is the answer's fault, said so
                name = checks.looked_up(err, hidden)
                if name is None:
                    raise
                named = sorted(h for h in hidden if not h.startswith("_") and h != "Out")
                return (f"predict{args} looked up `{name}`, which holds what the launches measured: predict each "
                        f"rank's list from the starting lists the text gives. While the check calls predict, the "
                        f"launches' results, the tables built from them ({', '.join(named)}) and the outputs the "
                        f"cells showed are out of its reach.", args[2])
            if not isinstance(got, list):
                return (f"predict{args} returned {got!r} ({type(got).__name__}), not a list: return the list the "
                        f"rank holds after the collective, a list even when it holds one number.", args[2])
            if got != want:
                return f"predict{args} returned {got!r}, which is not right.", args[2]
    return "", 0


# ---------------------------------------------------------------- exercise 2: the ring, as the ranks reported it

RING_BYTES_REL = 0.01    # the check's tolerance on each rank's bytes against 2(N−1)/N·S (the table uses it too)


def ring_bytes_agreement(rings: list) -> list[dict]:
    """:func:`course_utils.kernel.scale.wire.ring_agreement` judged at the exercise check's tolerance,
    :data:`RING_BYTES_REL`, so that the table and the check say the same."""
    from course_utils.kernel.scale import wire

    return [{**row, "within": abs(row["gap"]) <= RING_BYTES_REL, "tolerance": RING_BYTES_REL}
            for row in wire.ring_agreement(rings)]


def ring_collectives_problem(rings: list) -> str:
    """The collectives the learner's ring called on the ranks (``Ring.collectives``, recorded by
    :func:`course_utils.rank.ring.record_collectives`), as a sentence; "" when none."""
    ranks: dict[str, list[int]] = {}
    for ring in rings:
        for name in ring.collectives:
            ranks.setdefault(name, []).append(ring.rank)
    if not ranks:
        return ""
    calls = "; ".join(f"{name} on rank{'s' if len(on) > 1 else ''} {', '.join(map(str, sorted(on)))}"
                      for name, on in ranks.items())
    return (f"your ring_all_reduce called {calls} (recorded while it ran): a ring uses only point-to-point sends and "
            f"receives.")


def ring_in_place_problem(rings: list) -> str:
    """Ranks whose ring returned the right sum in a tensor of its own while the tensor it was given does not hold
    it after the call, as a sentence; "" when none."""
    copies = [r.rank for r in rings if r.returned_matches and not r.matches]
    if not copies:
        return ""
    return (f"on rank{'s' if len(copies) > 1 else ''} {', '.join(map(str, copies))} your function returned the sum "
            f"in a tensor of its own, but the tensor it was given does not hold it after the call: the exercise sums "
            f"`tensor` in place, and the script reads that tensor, not what you return.")


def ring_result_problem(rings: list) -> str:
    """Ranks whose tensor, after the learner's ring returned, differs from ``dist.all_reduce``'s result; "" when
    none."""
    wrong = [r.rank for r in rings if not r.matches]
    if not wrong:
        return ""
    return (f"after your function returned, the tensor passed in differs from dist.all_reduce's result on "
            f"rank{'s' if len(wrong) > 1 else ''} {', '.join(map(str, wrong))}.")


def ring_trace_missing(steps: list[RingStep], world_size: int) -> dict[int, list[int]]:
    """Rank → the chunks that, after that rank's last traced step, do not hold every rank's contribution (all of
    them for a rank with no record); ranks that hold every chunk complete are left out."""
    full = 2 ** world_size - 1
    last: dict[int, RingStep] = {}
    for s in steps:
        if s.rank not in last or s.step > last[s.rank].step:
            last[s.rank] = s
    missing = {r: ([c for c, v in enumerate(last[r].held) if v != full] if r in last else list(range(world_size)))
               for r in range(world_size)}
    return {r: chunks for r, chunks in missing.items() if chunks}


def _rank_chunks(missing: dict[int, list[int]]) -> str:
    return "; ".join(f"rank {r}: chunk{'s' if len(c) > 1 else ''} {', '.join(map(str, c))}" for r, c in missing.items())


def ring_trace_problem(steps: list[RingStep], world_size: int) -> str:
    """What the traced run of the learner's ring left incomplete, as a sentence; "" when every rank ends holding
    every chunk with all ranks' contributions."""
    missing = ring_trace_missing(steps, world_size)
    if not missing:
        return ""
    return (f"in the traced run (rank r starts with 2**r in every element), these chunks do not hold all {world_size} "
            f"ranks' data after the rank's last step: {_rank_chunks(missing)}.")


def ring_trace_summary(steps: list[RingStep], world_size: int) -> str:
    """What the trace shows, in one paragraph: the steps each rank took, the complete chunks after step N−1 (the end
    of the scatter-reduce), whether every chunk of every rank holds every rank's data at the end, and whether every
    message arrived as its sender sent it. Says what is missing where the trace lacks a step, never fails on it."""
    n = world_size
    full = 2 ** n - 1
    at = {(s.rank, s.step): s for s in steps}
    sends = {r: max((k for rank, k in at if rank == r), default=0) for r in range(n)}
    same = len(set(sends.values())) == 1
    parts = [("no rank sent a message" if not sends[0] else
              f"{sends[0]} step{'s' if sends[0] > 1 else ''} of one message per rank") if same else
             "messages per rank differ: " + ", ".join(f"rank {r}: {k}" for r, k in sends.items())]
    short = [r for r in range(n) if (r, n - 1) not in at]
    if short:
        parts.append(f"rank{'s' if len(short) > 1 else ''} {', '.join(map(str, short))} sent fewer than N−1 = {n - 1} "
                     f"messages, so there is no step N−1 to read there")
    else:
        after_scatter = {r: [c for c, v in enumerate(at[(r, n - 1)].held) if v == full] for r in range(n)}
        parts.append(f"after step N−1 = {n - 1} the complete chunks are {after_scatter} (rank: chunks)")
    missing = ring_trace_missing(steps, n)
    parts.append(f"at the end every chunk of every rank holds all {n} ranks: True" if not missing else
                 f"at the end these chunks do not hold all {n} ranks: {_rank_chunks(missing)}")
    pairs = [(r, k) for r, k in at if k >= 1]
    lost = [(r, k) for r, k in pairs if ((r - 1) % n, k) not in at or at[(r, k)].received != at[((r - 1) % n, k)].sent]
    parts.append("every message arrived as its sender sent it: " + ("True" if pairs and not lost else
                 "no message was traced" if not pairs else
                 f"False (rank, step: {', '.join(f'({r}, {k})' for r, k in lost[:6])}{' …' if len(lost) > 6 else ''})"))
    return "; ".join(parts)
