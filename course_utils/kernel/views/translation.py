"""Notebook 10's tables and figure: translations beside their references with the differing words marked, BLEU per
epoch against the word-for-word baseline and the ceiling, and ZeRO-2 and ZeRO-3 compared at the same step."""
from __future__ import annotations

import difflib
import re
import statistics
from typing import Any, Sequence


def mark_differences(translation: str, reference: str) -> tuple[str, int]:
    """``translation`` with every word that is not where the reference has it in [brackets] (a word-level diff:
    wrong, extra or misplaced words), and how many words of the two differ (the reference's missing ones too)."""
    words, ref = translation.split(), reference.split()
    marked, differing = list(words), 0
    for op, r0, r1, t0, t1 in difflib.SequenceMatcher(a=ref, b=words, autojunk=False).get_opcodes():
        if op != "equal":
            differing += max(r1 - r0, t1 - t0)
            for i in range(t0, t1):
                marked[i] = f"[{words[i]}]"
    return " ".join(marked), differing


def samples(sources: Sequence[str], references: Sequence[str], translations: dict[str, Sequence[str]], n: int = 6):
    """A table of ``n`` test sentences: source, reference and each system's translation with its differing words
    marked, plus the count of differing words per system."""
    import pandas as pd

    rows = []
    for i in range(min(n, len(sources))):
        row: dict[str, Any] = {"source": sources[i], "reference": references[i]}
        for name, texts in translations.items():
            row[name], row[f"≠ {name}"] = mark_differences(texts[i], references[i])
        rows.append(row)
    return pd.DataFrame(rows)


def at_step(name: str, evaluation, step_seconds: Sequence[float], bleu_before: float) -> dict[str, Any]:
    """One run's row of a like-for-like comparison, read at one of its evaluations (``evaluation``: the script's
    ``Evaluation`` record): its steps, the median seconds of those steps (evaluation excluded), the evaluation's
    seconds per translated example, and BLEU before training and at that evaluation."""
    steps = step_seconds[:evaluation.step]
    return {"run": name, "epoch": evaluation.epoch, "steps": evaluation.step,
            "seconds_per_step": statistics.median(steps),
            "eval_seconds_per_example": evaluation.seconds / evaluation.examples,
            "bleu_before": bleu_before, "bleu": evaluation.bleu}


def bleu_curve(curve: Sequence, before: float, baseline: float, points: dict[str, Any] | None = None,
               name: str = "ZeRO-2 + offload"):
    """BLEU after each epoch (``curve``: ``Evaluation`` records; epoch 0 is the untrained model), with the
    word-for-word baseline and the ceiling of 100 that the language's rules allow; ``points``: other runs'
    evaluations (name → record) drawn as single markers."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.plot([0] + [e.epoch for e in curve], [before] + [e.bleu for e in curve], "o-", label=name)
    for label, e in (points or {}).items():
        ax.plot([e.epoch], [e.bleu], "s", ms=9, mfc="none", label=f"{label} (epoch {e.epoch:g})")
    ax.axhline(baseline, ls="--", c="gray", label=f"word-for-word look-up ({baseline:.1f})")
    ax.axhline(100, ls=":", c="black", label="ceiling: the rules translate every sentence")
    ax.set(xlabel="epoch", ylabel="BLEU on the test pairs", ylim=(-3, 105),
           xticks=[0] + [e.epoch for e in curve], title="BLEU after each epoch")
    ax.legend(fontsize=8, loc="lower right")
    return fig


_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')
# the frames that tell where a rank of scripts/10_generate_zero3.py waits: its own lines, generate's loop, the model's
# forward, DeepSpeed's ZeRO-3 hook and parameter fetch, and the collective (torch.distributed) it waits in
_TELLING = ("scripts/", "generation/utils.py", "modeling_", "zero/parameter_offload.py",
            "zero/partitioned_param_coordinator.py", "zero/partition_parameters.py", "distributed_c10d.py")


def where_generating(stacks: dict[int, str]) -> dict[int, dict[str, Any]]:
    """Per rank, from the stacks a stalled launch collected (``LaunchError.result.stacks``): the path of its main
    thread through the telling frames, outermost first (``folder/file:line function``), whether it was inside a model's
    forward, and inside ZeRO-3's parameter fetch (``fetch_sub_module``, which waits for the all-gather)."""
    from course_utils.kernel.launch.stacks import main_thread_stack

    out = {}
    for rank, text in sorted(stacks.items()):
        frames = _FRAME.findall(main_thread_stack(text, frames=200))        # innermost first
        telling = [f"{'/'.join(path.split('/')[-2:])}:{line} {fn}" for path, line, fn in reversed(frames)
                   if any(t in path for t in _TELLING)]
        out[rank] = {"innermost": telling[-1] if telling else "", "in forward": any(
            "modeling_" in path and fn == "forward" for path, _, fn in frames),
            "in fetch_sub_module": any(fn == "fetch_sub_module" for _, _, fn in frames),
            "in barrier": any(fn == "barrier" for _, _, fn in frames), "path": telling}
    return out


HIDDEN_SIZE_KEYS = ("stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")   # transformers fills them for ZeRO-3


def zero3_problem(config: dict, z2: dict, planned: dict[str, bool]) -> str:
    """Exercise 2, before the launch: what keeps ``config`` from being the ZeRO-2 file ``z2`` moved to ZeRO-3 with
    both offloads and the gather for save_model ('' when nothing does). ``planned``: each of the first three points
    (and the gather) as DeepSpeed's config classes read it. Point 4 reads the config as written: the ZeRO-3 sizes that
    depend on the model must be "auto", which transformers fills from the model's hidden size
    (``HfTrainerDeepSpeedConfig.trainer_config_finalize``); DeepSpeed's defaults are fixed numbers (a persistence
    threshold of 1e5 keeps every tensor of the course's small model whole on every rank)."""
    missing = [what for what, ok in planned.items() if not ok]
    if missing:
        return f"your config lacks {' and '.join(missing)}."
    zero = config.get("zero_optimization", {})
    fixed = [k for k in HIDDEN_SIZE_KEYS if zero.get(k) != "auto"]
    if fixed:
        return (f"your config does not leave {' and '.join(fixed)} to the Trainer (\"auto\", point 4): DeepSpeed's "
                "defaults are fixed numbers, not sizes for this model.")
    changed = sorted(k for k in set(z2) | set(config) if k != "zero_optimization" and z2.get(k) != config.get(k))
    if changed:
        return (f"your config changes {', '.join(changed)}, outside zero_optimization: keep the rest of the ZeRO-2 "
                "file, so that the two runs differ in ZeRO only.")
    return ""
