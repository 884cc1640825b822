"""Notebook 02's training-loss figures: each step's batch loss as every rank measured it, beside what that rank's
``train_step`` returned for logging (scripts/02_train.py records both)."""
from __future__ import annotations

from course_utils.common.record import read_as
from course_utils.common.records.training import TrainLoss


def step_losses(records: list[dict], world_size: int):
    """Two step × rank DataFrames from a launch of scripts/02_train.py: ``own``, the loss of each rank's own batch
    as the script measured it (from the step's logits), and ``returned``, what that rank's ``train_step`` returned."""
    import pandas as pd

    rows = {r: pd.DataFrame(read_as(records, TrainLoss, rank=r)).set_index("step") for r in range(world_size)}
    own = pd.DataFrame({r: t["own"] for r, t in rows.items()})
    returned = pd.DataFrame({r: t["mean"] for r, t in rows.items()})
    return own, returned


def backward_problem(records: list[dict], world_size: int, rel: float = 1e-3) -> str:
    """What is wrong with the losses ``train_step`` handed to ``engine.backward`` ('' when nothing is): at every step,
    on every rank, exactly one call, with the loss of that rank's own batch as the script measured it (fp32 here: the
    two agree to float rounding). Never the values themselves."""
    rows = [r for rank in range(world_size) for r in read_as(records, TrainLoss, rank=rank)]
    if not rows:
        return "the launch recorded no training step."
    missing = [r for r in rows if r.backward is None]
    if missing:
        return (f"at {len(missing)} of {len(rows)} steps × ranks train_step did not call engine.backward exactly once "
                f"(the first: step {missing[0].step}).")
    off = [r for r in rows if abs(r.backward - r.own) > rel * max(abs(r.own), 1e-6)]
    if off:
        worst = max(abs(r.backward - r.own) / max(abs(r.own), 1e-6) for r in off)
        return (f"at {len(off)} of {len(rows)} steps × ranks the loss handed to engine.backward is not the loss of that "
                f"rank's own batch (off by up to {worst:.0%}): the gradients must come from the loss the model computed, "
                "and all_reduce changes the tensor it is given in place.")
    return ""


def misreported(own, returned, rel: float = 1e-5) -> str:
    """What is wrong with the values ``train_step`` returned, judged against the mean over ranks of the losses the
    ranks measured: '' when every rank returned that mean at every step, else how many steps are off and, for the
    two usual slips (each rank's own loss, the sum over ranks), which one. Never the values themselves."""
    import numpy as np

    got, measured = returned.to_numpy(), own.to_numpy()
    mean = measured.mean(axis=1, keepdims=True)
    wrong = ~np.isclose(got, mean, rtol=rel, atol=0)
    if not wrong.any():
        return ""
    said = (f"at {int(wrong.any(axis=1).sum())} of {len(got)} steps a rank returned something other than the mean "
            "over ranks of the batch losses the ranks measured")
    if np.isclose(got, measured, rtol=rel, atol=0).all():
        said += "; each rank returned the loss of its own batch, which no other rank has"
    elif np.isclose(got, mean * measured.shape[1], rtol=rel, atol=0).all():
        said += f"; your values are {measured.shape[1]} times that mean: the sum over the ranks"
    return said + "."


def plot_loss(own, batches_per_epoch: int, window: int = 10):
    """The mean over ranks of each step's batch loss (thin) and its running mean over ``window`` steps, with the
    epoch boundaries marked: a figure of what the ranks measured, not of what a logging function returned."""
    import matplotlib.pyplot as plt

    mean = own.mean(axis=1)
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.plot(mean.index, mean, lw=0.8, alpha=0.45, label="each step")
    ax.plot(mean.index, mean.rolling(window, min_periods=1).mean(), lw=2, label=f"running mean of {window} steps")
    for boundary in range(batches_per_epoch, int(mean.index.max()), batches_per_epoch):
        ax.axvline(boundary + 0.5, color="grey", ls="--", lw=1)
    ax.set(xlabel="step", ylabel="batch loss (mean over ranks)",
           title=f"training loss, {own.shape[1]} ranks (dashed: a new epoch)")
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def vocabularies(texts, vocab_size: int, times: int = 3):
    """Train the WordPiece tokenizer ``times`` times on the same ``texts``, with ``tokenizers``' trainer alone and with
    the course's fixed order (:func:`course_utils.rank.data.train_wordpiece`): one row each, with how many different
    vocabularies the trainings gave, their sizes, and, for each later training, how many pieces of the first one's
    vocabulary it lacks or numbers otherwise."""
    import pandas as pd

    from course_utils.rank.data import train_wordpiece

    rows = {}
    for name, fixed in (("tokenizers' trainer alone", False), ("data.train_wordpiece (fixed order)", True)):
        first, *later = [train_wordpiece(texts, vocab_size, fixed_order=fixed).get_vocab() for _ in range(times)]
        rows[name] = {f"vocabularies in {times} trainings": len({tuple(sorted(v.items())) for v in [first, *later]}),
                      "pieces": sorted({len(v) for v in [first, *later]}),
                      "the 1st's pieces lost or renumbered": [sum(v.get(piece) != i for piece, i in first.items())
                                                              for v in later]}
    return pd.DataFrame(rows).T


def recall(confusion, labels: list[str]):
    """Per-class recall from a confusion matrix (row: the true label, column: the predicted one): the share of each
    label's examples that the model gave that label, as a Series named by ``labels``."""
    import pandas as pd

    table = pd.DataFrame(confusion, index=labels, columns=labels)
    return pd.Series([table.loc[k, k] / table.loc[k].sum() for k in labels], index=labels, name="recall")


def initial_signal(tokenizer, texts, seed: int = 0):
    """How much an untrained classifier's output depends on the sentence it reads, with BERT's initial std (0.02) and
    with the width-scaled std of :func:`course_utils.rank.data.emotion_classifier`: for the last hidden state at the
    [CLS] position (what the classifier head reads) and for the logits, how far each sentence's vector lies from the
    mean over ``texts``, as a share of the vectors' size (0: every sentence gets the same output)."""
    import pandas as pd
    import torch

    from course_utils.rank.data import EMOTION_LABELS, emotion_classifier
    from course_utils.rank.models import tiny_bert_classifier

    def spread(vectors):
        return float((vectors - vectors.mean(0)).norm(dim=1).mean() / vectors.norm(dim=1).mean())

    batch = tokenizer(list(texts), padding=True, return_tensors="pt", return_token_type_ids=False)
    rows = {}
    for model in (tiny_bert_classifier(len(tokenizer), len(EMOTION_LABELS), seed=seed),
                  emotion_classifier(len(tokenizer), seed=seed)):
        model.eval()
        with torch.no_grad():
            out = model(**batch, output_hidden_states=True)
        rows[f"std {model.config.initializer_range:.3f}"] = {"[CLS] output": spread(out.hidden_states[-1][:, 0]),
                                                             "logits": spread(out.logits)}
    return pd.DataFrame(rows).T
