"""Notebook 16 in the kernel, section 3's long sequence: one launch of ``scripts/16_long_sequence.py`` under the
notebook's limit, and what its rank recorded before the limit ended it.

The launch makes the memory cgroup as :func:`course_utils.kernel.views.bigger.try_sizes` does (on a GPU the rank caps
its CUDA allocator instead; on a CPU without a writable memory cgroup nothing is launched and the reason is kept).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from course_utils.common.record import read_as
from course_utils.common.records.bigger import Limit
from course_utils.common.records.bigger_sequence import (CHECKPOINTED, N_EMBD, N_LAYER, PLAIN, SHORT, BlockMemory,
    Pass, PassResult)
from course_utils.kernel.launch.options import launches
from course_utils.kernel.views.bigger import (CPU_CAP_MB, FAILED, OUT_OF_MEMORY, PROCS, TRAINED, _launch,
    killed_for_memory)

MiB = 2**20
SCRIPT = "16_long_sequence.py"
# On a CPU, under notebook 16's limit (fp32): the short pass peaks near 124 MiB, the long one with checkpointing near
# 153 MiB (0.43 × the limit), and the long one without it peaked at 565 MiB when run alone under a 1 GiB limit (1.6 ×):
# a clear margin on both sides. The notebook checks both margins in every run (its projection of the plain forward).
SHORT_TOKENS, LONG_TOKENS = 256, 2048


def tokens_for(cap_mb: int, is_gpu: bool) -> tuple[int, int]:
    """(short, long) tokens for a limit of ``cap_mb`` MiB: on a CPU :data:`SHORT_TOKENS` and :data:`LONG_TOKENS`
    (sized for notebook 16's CPU limit, :data:`CPU_CAP_MB`); on a GPU the long sequence grows with the limit, twice as
    fast because bf16 activations take half of fp32's bytes, to the power of two at or above it."""
    if not is_gpu:
        return SHORT_TOKENS, LONG_TOKENS
    long = 1 << max(11, int(LONG_TOKENS * 2 * cap_mb / CPU_CAP_MB - 1).bit_length())
    return long // 8, long


@dataclass
class SequenceOutcome:
    """What the launch did: each pass it started, each pass that trained, and how it ended."""
    cap_mb: int
    short: int
    long: int
    limit: Limit | None = None
    passes: list[Pass] = field(default_factory=list)
    results: list[PassResult] = field(default_factory=list)
    blocks: list[BlockMemory] = field(default_factory=list)
    error: str | None = None          # the runner's message when the launch failed
    skipped: str | None = None        # why nothing was launched
    cgroup: str | None = None

    def result(self, name: str) -> PassResult | None:
        return next((r for r in self.results if r.name == name), None)

    def started(self, name: str) -> Pass | None:
        return next((p for p in self.passes if p.name == name), None)

    def curve(self, name: str) -> list[int]:
        """What the limit counted after each block's forward in pass ``name``, block by block (as far as it got)."""
        return [b.bytes for b in sorted((b for b in self.blocks if b.name == name), key=lambda b: b.block)]

    @property
    def statuses(self) -> dict[str, str]:
        """pass → trained | out of memory | failed (a pass started and never finished)."""
        ended = OUT_OF_MEMORY if self.error and killed_for_memory(self.error) else FAILED
        return {p.name: TRAINED if self.result(p.name) else ended for p in self.passes}


@launches(procs=PROCS)
def try_long_sequence(cap_mb: int, short: int, long: int, timeout: int = 600) -> SequenceOutcome:
    """Launch the long sequence's one rank under a limit of ``cap_mb`` MiB: ``short`` tokens without checkpointing,
    ``long`` tokens with transformers' activation checkpointing, then ``long`` without it (the pass the limit ends)."""
    from course_utils.kernel import hardware
    from course_utils.kernel.launch.memcap import MemoryCapUnavailable, memory_cap

    args = ["--cap_mb", cap_mb, "--short", short, "--long", long]
    outcome = SequenceOutcome(cap_mb, short, long)
    try:
        with memory_cap(cap_mb) as procs:
            outcome.cgroup = procs.parent.name
            records, outcome.error, _ = _launch(args + ["--cgroup_procs", procs], timeout, True, script=SCRIPT)
    except MemoryCapUnavailable as err:
        if not hardware.detect().is_gpu:        # a GPU rank caps its CUDA allocator and needs no cgroup
            outcome.skipped = str(err)
            return outcome
        records, outcome.error, _ = _launch(args, timeout, True, script=SCRIPT)
    limits = read_as(records, Limit)
    outcome.limit = limits[0] if limits else None
    outcome.passes, outcome.results = read_as(records, Pass), read_as(records, PassResult)
    outcome.blocks = read_as(records, BlockMemory)
    return outcome


def summary(outcome: SequenceOutcome) -> str:
    """One line per pass: its tokens, whether transformers checkpointed its blocks, and how it ended."""
    if outcome.skipped:
        return f"the long sequence: skipped — {outcome.skipped}"
    kind = outcome.limit.kind if outcome.limit else "?"
    params = outcome.passes[0].params if outcome.passes else 0
    lines = [f"GPT-2 of n_embd {N_EMBD} × {N_LAYER} blocks, {params / 1e6:.1f} M parameters (16 B/parameter = "
             f"{16 * params / MiB:.0f} MiB), ZeRO-3 + offload (CPU), one sequence a step, limit {outcome.cap_mb} MiB "
             f"({kind}):"]
    for p in outcome.passes:
        how = (f"activation_checkpointing_enable(): {p.checkpointed_blocks} of {p.blocks} blocks checkpointed"
               if p.checkpointed_blocks else "no block checkpointed")
        done = outcome.result(p.name)
        ended = (f"trained, loss {done.loss:.2f}, {done.seconds:.2f} s, peak {done.peak_bytes / MiB:.0f} MiB of "
                 f"{outcome.cap_mb}" if done else outcome.statuses[p.name])
        lines.append(f"  {p.name:22s} {p.tokens:>6} tokens, {how}: {ended}")
    return "\n".join(lines)


def problem(outcome: SequenceOutcome) -> str | None:
    """What in this run contradicts the section's text, or None: the short and the checkpointed pass trained under
    the limit, the plain long pass was ended by it, and only transformers' flag checkpointed anything."""
    want = {SHORT: TRAINED, CHECKPOINTED: TRAINED, PLAIN: OUT_OF_MEMORY}
    if outcome.statuses != want:
        return f"the passes ended {outcome.statuses}, not {want}: {outcome.error or 'the launch finished'}"
    plain, checkpointed = outcome.started(PLAIN), outcome.started(CHECKPOINTED)
    if any(p.ds_configured or not p.config_section for p in outcome.passes):
        return "DeepSpeed's checkpointing was configured in a pass, or a pass ran without its config section"
    if plain.checkpointed_blocks:
        return "the pass without transformers' checkpointing checkpointed blocks"
    if checkpointed.checkpointed_blocks != checkpointed.blocks:
        return "transformers' activation_checkpointing_enable() left blocks unchecked"
    return None


def forward_need(outcome: SequenceOutcome, name: str = PLAIN) -> float | None:
    """Bytes the forward of pass ``name`` would have reached after its last block, had the limit let it: the last
    count it recorded plus, for each block it did not reach, the median growth per block of those it did. A lower
    bound on its peak: the backward comes after. None with fewer than two blocks recorded."""
    curve, started, growth = outcome.curve(name), outcome.started(name), growth_per_block(outcome, name)
    if growth is None or started is None:
        return None
    return curve[-1] + (started.blocks - len(curve)) * growth


def plot(outcome: SequenceOutcome):
    """What the limit counted after each block's forward, for the long sequence with and without checkpointing, with
    the plain pass's projection past the point where the limit ended it."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    for name, colour in ((CHECKPOINTED, "tab:blue"), (PLAIN, "tab:red")):
        curve = outcome.curve(name)
        ax.plot(range(1, len(curve) + 1), [b / MiB for b in curve], marker="o", ms=3, color=colour, label=name)
    need, plain, started = forward_need(outcome), outcome.curve(PLAIN), outcome.started(PLAIN)
    if need is not None:
        ax.plot([len(plain), started.blocks], [plain[-1] / MiB, need / MiB], ls=":", color="tab:red",
                label="projected from its growth per block")
    ax.axhline(outcome.cap_mb, color="black", ls="--", label=f"the limit ({outcome.cap_mb} MiB)")
    ax.set_xlabel("blocks done in the forward")
    ax.set_ylabel("MiB counted by the limit")
    ax.set_title(f"One sequence of {outcome.long} tokens under ZeRO-3 + offload (CPU)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def growth_per_block(outcome: SequenceOutcome, name: str) -> float | None:
    """The median bytes the limit counted more after each block's forward than after the block before, in pass
    ``name`` (what one block keeps for the backward); None with fewer than two blocks recorded."""
    import statistics

    curve = outcome.curve(name)
    return statistics.median(b - a for a, b in zip(curve, curve[1:])) if len(curve) > 1 else None


def message_head(outcome: SequenceOutcome) -> str:
    """The runner's message without the rank's last lines (the summary above has what the rank printed): on a CPU the
    killed rank's paragraph, on a GPU the rank's traceback; "" when the launch did not fail."""
    return (outcome.error or "").split("\n--- rank ")[0]


def record(outcome: SequenceOutcome) -> dict:
    """The launch's figures for the notebook's metrics: how each pass ended and what it measured, the runner's
    message's first line, the growth per block and the plain forward's projected need."""
    from dataclasses import asdict

    return {"cap_mb": outcome.cap_mb, "short": outcome.short, "long": outcome.long, "skipped": outcome.skipped,
            "cgroup": outcome.cgroup, "limit": outcome.limit.kind if outcome.limit else None,
            "statuses": outcome.statuses, "passes": [asdict(p) for p in outcome.passes],
            "results": [asdict(r) for r in outcome.results],
            "curves": {p.name: outcome.curve(p.name) for p in outcome.passes},
            "growth_per_block": {p.name: growth_per_block(outcome, p.name) for p in outcome.passes},
            "forward_need": forward_need(outcome),
            "error_first_line": message_head(outcome).split("\n")[0].split(": ")[0] if outcome.error else None,
            "error": outcome.error}
