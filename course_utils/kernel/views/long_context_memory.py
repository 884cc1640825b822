"""Notebook 17 in the kernel: the longest sequence each sequence-parallel (SP) size trains under the same limit per
rank, what a token costs a rank at each SP size, and what ALST's tiling saves.

:func:`longest_sequence` is one launch of ``scripts/17_longest_sequence.py`` on SP ranks (SP = the world size), each
rank under a limit of its own: a count of the bytes of its tensors (``course_utils.rank.tensor_bytes``), past which
its allocation raises ``torch.OutOfMemoryError`` and the launch ends; the runner removes the launch's ``/dev/shm``
buffers whatever ended it. A count, not the machine's memory: the same on every machine and in every run, so that
the longest lengths, and a prediction of them, do not depend on the run. The ranks are CPU ranks on every machine
(:func:`one_rank`, :func:`four_ranks`, and notebook 17's first launch for SP 2), so that every SP size of the lesson
is measured on the same kind of device under the same limit.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from course_utils.common.record import read_as
from course_utils.common.records.bigger import Limit
from course_utils.common.records.long_context import PERIOD
from course_utils.common.records.long_context_memory import (CAP_MB, KERNEL, KERNELS, LENGTHS, STEPS, LengthAttempt,
    LengthRefused, LengthTrial, TilingComparison)
from course_utils.kernel.launch.options import launches
from course_utils.kernel.views.bigger import FAILED, OUT_OF_MEMORY, TRAINED

MiB = 2**20
SP_SIZES = (1, 2, 4)      # the lesson's SP sizes: 4 query heads and 2 key/value heads allow these


@dataclass
class SpOutcome:
    """What one launch at one SP size did: the lengths its ranks attempted, what each rank measured, how it ended."""
    sp: int
    cap_mb: int
    limits: list[Limit]                   # one per rank
    attempts: list[LengthAttempt]         # rank 0's, in the order tried
    trials: list[LengthTrial]             # every rank's
    tiling: TilingComparison | None = None
    error: str | None = None              # the runner's message when the launch failed
    seconds: float = 0.0
    statuses: dict = field(default_factory=dict)     # length → trained | out of memory | failed
    refusals: list[LengthRefused] = field(default_factory=list)     # the record of each rank whose limit refused a length

    @property
    def trained(self) -> list[int]:
        """The lengths every rank trained, in the order tried."""
        lengths = [a.length for a in self.attempts]
        return [n for n in lengths if sum(t.length == n for t in self.trials) == self.sp]

    @property
    def longest(self) -> int | None:
        """The longest length that trained (lengths are tried in ascending order)."""
        return max(self.trained, default=None)

    def peak(self, length: int) -> int:
        """The highest peak any rank's limit counted at ``length``."""
        return max(t.peak_bytes for t in self.trials if t.length == length)

    def held(self, length: int) -> int:
        """The most any rank held when ``length`` started (its engine, what earlier lengths left)."""
        return max(t.held_before for t in self.trials if t.length == length)

    def step_seconds(self, length: int) -> float:
        """The slowest rank's slowest step at ``length``."""
        return max(max(t.step_seconds) for t in self.trials if t.length == length)

    def loss(self, length: int) -> float:
        """The mean token loss over the whole sequence at ``length`` (every rank computes the same)."""
        return next(t.losses[-1] for t in self.trials if t.length == length)

    def attention(self, length: int) -> dict:
        """What rank 0's attention kernel got at ``length`` (:func:`attention_heads`)."""
        return attention_heads(next(t for t in self.trials if t.length == length))


def attention_heads(trial: LengthTrial) -> dict:
    """The heads and length one rank's attention kernel got (after Ulysses' all-to-all), and the bytes a token of the
    whole sequence costs that rank there per layer for its query, key and value (its inputs; the kernel's own
    memory comes on top)."""
    query, key = trial.attention["query"], trial.attention["key"]
    head_size, size = query[3], trial.attention["element_size"]
    return {"query heads": query[1], "key/value heads": key[1], "length": query[2],
            "bytes a token a layer": (query[1] + 2 * key[1]) * head_size * size}


def statuses(attempts: list[LengthAttempt], trained: list[int], refused: list[int]) -> dict[int, str]:
    """length → outcome: trained; attempted without a trial on every rank, out of memory where a rank's limit
    recorded its refusal (``refused``), else failed (any other error)."""
    return {a.length: TRAINED if a.length in trained else OUT_OF_MEMORY if a.length in refused else FAILED
            for a in attempts}


CPU_RANKS = {"DS_ACCELERATOR": "cpu"}     # the placement the launches declare: CPU ranks on any machine


def longest_sequence(sp: int, cap_mb: int = CAP_MB, lengths: list[int] | tuple[int, ...] = LENGTHS,
                     steps: int = STEPS, tiling_length: int = 0, kernel: str = KERNEL,
                     timeout: int = 120, quiet: bool = True) -> SpOutcome:
    """Launch SP ``sp`` (``sp`` ranks) with each rank under a limit of ``cap_mb`` MiB, training ``lengths`` in this
    order until one does not fit (with ``tiling_length``, the tiling comparison first, at that length)."""
    from course_utils.kernel import hardware

    whole = max(SP_SIZES) * PERIOD
    bad = [n for n in lengths if n % whole]
    if bad:
        raise ValueError(f"length {bad[0]} is not a multiple of {whole}: every SP size must cut it into shards of "
                         "whole data periods")
    if list(lengths) != sorted(lengths):
        raise ValueError("give the lengths in ascending order: the first one that does not fit ends the launch")
    if kernel not in KERNELS:
        raise ValueError(f"kernel {kernel!r}: choose one of {KERNELS}")
    args = (["--lengths", *lengths, "--cap_mb", cap_mb, "--steps", steps, "--tiling_length", tiling_length,
             "--kernel", kernel])
    env = hardware.cpu_ranks_env(sp, gpu_machine=hardware.detect().is_gpu)
    records, error, seconds = _launch(sp, args, env, timeout, quiet)
    return outcome_of(sp, cap_mb, records, error, seconds)


def outcome_of(sp: int, cap_mb: int, records: list[dict], error: str | None, seconds: float) -> SpOutcome:
    """The :class:`SpOutcome` of a launch's records (this module's launches, or notebook 17's first launch with its
    lengths grown at the end)."""
    attempts = read_as(records, LengthAttempt)
    trials = read_as(records, LengthTrial, rank=None)
    tiling = read_as(records, TilingComparison)
    outcome = SpOutcome(sp, cap_mb, read_as(records, Limit, rank=None), attempts, trials,
                        tiling[0] if tiling else None, error=error, seconds=seconds,
                        refusals=read_as(records, LengthRefused, rank=None))
    outcome.statuses = statuses(attempts, outcome.trained, [r.length for r in outcome.refusals])
    return outcome


def _launch(sp: int, args: list, env: dict | None, timeout: int, quiet: bool) -> tuple[list[dict], str | None, float]:
    from course_utils.kernel import launch

    try:
        result = launch.deepspeed("17_longest_sequence.py", *args, procs=sp, env=env, timeout=timeout, quiet=quiet)
        return result.records, None, result.seconds
    except launch.LaunchError as err:
        return err.result.records, str(err), err.result.seconds


@launches(procs=1, env=CPU_RANKS)
def one_rank(cap_mb: int = CAP_MB, lengths=LENGTHS, **kwargs) -> SpOutcome:
    """SP 1: :func:`longest_sequence` on one CPU rank."""
    return longest_sequence(1, cap_mb, lengths, **kwargs)


@launches(procs=4, min_ranks=4, env=CPU_RANKS)
def four_ranks(cap_mb: int = CAP_MB, lengths=LENGTHS, **kwargs) -> SpOutcome:
    """SP 4: :func:`longest_sequence` on four CPU ranks."""
    return longest_sequence(4, cap_mb, lengths, **kwargs)


# ---------------------------------------------------------------- what the records say

def summary(outcome: SpOutcome) -> str:
    """One line per length of a launch, and how the launch ended."""
    kernel = outcome.trials[0].kernel if outcome.trials else "default"
    lines = [f"SP {outcome.sp} ({outcome.sp} rank{'s' if outcome.sp > 1 else ''}, each under a limit of "
             f"{outcome.cap_mb} MiB of tensors; attention kernel: {kernel}), {outcome.seconds:.1f} s:"]
    for length, status in outcome.statuses.items():
        if status == TRAINED:
            lines.append(f"  {length:>6} tokens ({length // outcome.sp:>5} a rank): trained, loss "
                         f"{outcome.loss(length):.3f}, {outcome.step_seconds(length):.2f} s a step, peak "
                         f"{outcome.peak(length) / MiB:.0f} MiB ({outcome.held(length) / MiB:.0f} held before)")
        else:
            refused = next((r for r in outcome.refusals if r.length == length), None)
            said = (f" — {refused.operator} took a rank's tensors to {refused.count_bytes / MiB:.1f} MiB"
                    if refused else "")
            lines.append(f"  {length:>6} tokens ({length // outcome.sp:>5} a rank): {status}{said}")
    if outcome.trained:
        heads = outcome.attention(outcome.trained[0])
        lines.append(f"  inside attention each rank holds the whole length for {heads['query heads']} query and "
                     f"{heads['key/value heads']} key/value head(s)")
    if outcome.error and not outcome.refusals:
        lines.append(f"  the launch failed: {outcome.error.splitlines()[0]}")
    return "\n".join(lines)


def peaks_table(outcomes: list[SpOutcome]):
    """Each length's peak per rank (MiB) at each SP size: the most any rank's limit counted; "out of memory" where the
    limit ended the launch, empty where it was not tried."""
    import pandas as pd

    rows = {}
    for o in outcomes:
        for length, status in o.statuses.items():
            rows.setdefault(length, {})[f"SP {o.sp}"] = round(o.peak(length) / MiB, 1) if status == TRAINED else status
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis("tokens").sort_index()


def tiling_table(comparison: TilingComparison):
    """One row per setting of the tiling comparison: what the pass added to the limit's count at its peak, what that
    saved against the plain pass, and how far its loss and gradients are from the plain pass's."""
    import pandas as pd

    plain = comparison.peaks["plain"]
    return pd.DataFrame([{"setting": name, "pass peak MiB": peak / MiB, "saved MiB": (plain - peak) / MiB,
                          "loss": comparison.losses[name], "|Δ loss|": comparison.loss_diff[name],
                          "max |Δ grad|": comparison.grad_max_diff[name], "s": comparison.seconds[name]}
                         for name, peak in comparison.peaks.items()]).set_index("setting")
