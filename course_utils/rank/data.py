"""Offline data for the ranks: generated data sets (via ``datasets``), WordPiece tokenizers trained
locally with ``tokenizers`` (cached under ``build/data``), the deterministic streams of the
checkpoint, Trainer and precision experiments, and the classifier notebook 02 trains on its emotion data.

The emotion data set (notebook 02) stands in for a common tutorial's 6-class Chinese emotion corpus: short English sentences
whose label follows from an emotion cue phrase, with negated cues of *other* emotions mixed in
("i am not furious ..."), so a model must read word order, not just count keywords.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Iterable

from course_utils.common import paths
from course_utils.rank.models import preset

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
EMOTION_LABELS = ["other", "like", "sadness", "disgust", "anger", "happiness"]
_LABEL_WEIGHTS = [0.30, 0.14, 0.14, 0.12, 0.12, 0.18]      # uneven, like that tutorial's corpus
_CUES = {
    "like": ["love", "adore", "enjoy", "really like", "am fond of", "appreciate", "cherish", "am into"],
    "sadness": ["miss", "feel lonely without", "am heartbroken about", "cry over", "feel down about",
                "grieve for", "despair over", "mourn"],
    "disgust": ["am grossed out by", "am disgusted by", "feel sick about", "am sickened by", "can't stomach",
                "am repulsed by", "am revolted by", "am nauseated by"],
    "anger": ["am furious about", "am outraged by", "am livid about", "am fuming over", "am mad at",
              "can't stand", "am enraged by", "resent"],
    "happiness": ["am delighted with", "am thrilled about", "am overjoyed with", "am so glad about",
                  "am cheerful about", "am ecstatic about", "celebrate", "am elated by"],
}
_NEUTRAL = ["saw", "bought", "read about", "walked past", "talked about", "wrote down", "looked at",
            "checked", "moved", "cleaned", "noticed", "mentioned"]
_SUBJECTS = ["i", "honestly i", "today i", "frankly i", "again i", "lately i", "still i", "sometimes i"]
_OBJECTS = ["the new phone", "my neighbour's dog", "this weather", "the train schedule", "our old house",
            "the final exam", "that movie", "the office party", "my brother's cooking", "the long queue",
            "this city", "the football match", "the hospital food", "the garden", "my job", "the concert"]
_TAILS = ["", "", "this week", "every morning", "after lunch", "at the weekend", "again", "right now",
          "these days", "since monday"]


def _publish(tmp: Path, folder: Path) -> None:
    """Move a finished write into place; if another process got there first, keep theirs."""
    import shutil

    try:
        tmp.rename(folder)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def _clause(subject: str, verb: str, obj: str) -> str:
    return f"{subject} {verb} {obj}"


def emotion_example(rng: random.Random) -> tuple[str, int]:
    """One (sentence, label id). The label's cue appears plainly; with some probability a negated
    cue of another emotion is added before or after it ("... but i am not furious about ...")."""
    label = rng.choices(range(len(EMOTION_LABELS)), weights=_LABEL_WEIGHTS)[0]
    name = EMOTION_LABELS[label]
    verb = rng.choice(_NEUTRAL) if name == "other" else rng.choice(_CUES[name])
    parts = [_clause(rng.choice(_SUBJECTS), verb, rng.choice(_OBJECTS))]
    if rng.random() < 0.4:                        # a denied emotion: a distractor that must be read in context
        other = rng.choice([n for n in _CUES if n != name])
        cue = rng.choice([c for c in _CUES[other] if not c.startswith("can't")])
        negated = f"am not {cue[3:]}" if cue.startswith("am ") else f"don't {cue}"
        parts.insert(rng.randrange(2), _clause("i", negated, rng.choice(_OBJECTS)))
    text = " , but ".join(parts) + (" " + rng.choice(_TAILS) if rng.random() < 0.5 else "")
    return text.strip(), label


def emotion_dataset(train_size: int, eval_size: int, seed: int = 0):
    """A ``datasets.DatasetDict`` with "train" and "eval" splits (columns idx, text, label),
    generated once per (sizes, seed) and cached under ``build/data``."""
    import datasets

    datasets.disable_progress_bars()
    folder = paths.data_dir() / f"emotion_{train_size}_{eval_size}_{seed}"
    if (folder / "dataset_dict.json").exists():
        return datasets.load_from_disk(str(folder))
    rng = random.Random(seed)
    splits = {}
    for split, size in (("train", train_size), ("eval", eval_size)):
        rows = [emotion_example(rng) for _ in range(size)]
        splits[split] = datasets.Dataset.from_dict(
            {"idx": list(range(size)), "text": [t for t, _ in rows], "label": [lab for _, lab in rows]},
            features=datasets.Features({"idx": datasets.Value("int64"), "text": datasets.Value("string"),
                                        "label": datasets.ClassLabel(names=EMOTION_LABELS)}))
    data = datasets.DatasetDict(splits)
    tmp = folder.with_name(folder.name + f".tmp{random.getrandbits(32)}")
    data.save_to_disk(str(tmp))
    _publish(tmp, folder)
    return datasets.load_from_disk(str(folder))


def train_wordpiece(texts: Iterable[str], vocab_size: int, lowercase: bool = True, fixed_order: bool = True):
    """Train a BERT-style WordPiece tokenizer on ``texts`` and wrap it for transformers.

    The result adds ``[CLS] … [SEP]`` around every text and pads with ``[PAD]`` (id 0), like
    ``bert-base-uncased``, so BERT models built from a config take its output unchanged.

    ``tokenizers``' trainer alone (``fixed_order=False``) does not repeat: it numbers the ``##`` pieces in the order of
    a hash map, which changes with every training, and breaks ties between equally frequent merges by those numbers
    (huggingface/tokenizers#1794), so the same texts give other pieces under other ids, and a model seeded alike
    starts from other embeddings for the same words. With ``fixed_order`` the vocabulary kept is what the texts need,
    numbered in a fixed order: the special tokens, then the alphabet (with its ``##`` forms) and the pieces the trained
    tokenizer cuts ``texts`` into, sorted. That is the same in every training whenever the trainer stops before
    ``vocab_size`` (every word of ``texts`` then has a piece of its own), as it does for the emotion data set.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    texts = list(texts)
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                                                show_progress=False))
    if fixed_order:
        alphabet = {piece for piece in tok.get_vocab() if len(piece.removeprefix("##")) == 1}
        used = {piece for encoding in tok.encode_batch(texts) for piece in encoding.tokens}
        kept = SPECIAL_TOKENS + sorted((alphabet | used) - set(SPECIAL_TOKENS))
        tok.model = models.WordPiece({piece: i for i, piece in enumerate(kept)}, unk_token="[UNK]")
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")


def cached_wordpiece(name: str, texts: Iterable[str], vocab_size: int):
    """:func:`train_wordpiece`, saved under ``build/data/wordpiece/<name>`` and loaded from there next time."""
    from transformers import PreTrainedTokenizerFast

    folder = paths.data_dir() / "wordpiece" / name
    if (folder / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    tokenizer = train_wordpiece(texts, vocab_size)
    tmp = folder.with_name(folder.name + f".tmp{random.getrandbits(32)}")
    tokenizer.save_pretrained(str(tmp))
    _publish(tmp, folder)
    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def tokenize(split, tokenizer, max_length: int):
    """Fixed-length token ids for a split, as torch tensors (columns idx, input_ids, attention_mask, label)."""
    import datasets

    datasets.disable_progress_bars()
    encoded = split.map(lambda batch: tokenizer(batch["text"], padding="max_length", truncation=True,
                                                max_length=max_length, return_token_type_ids=False),
                        batched=True)
    encoded.set_format("torch", columns=["idx", "input_ids", "attention_mask", "label"])
    return encoded


def cached_emotion_tokens(train_size: int, eval_size: int, vocab_size: int, max_length: int) -> dict:
    """The emotion splits tokenized (:func:`emotion_dataset`, :func:`cached_wordpiece`, :func:`tokenize`) as plain
    tensors, ``{"vocabulary": size, "train": {column: tensor}, "eval": {...}}``, saved under ``build/data/tokens`` and
    loaded from there next time: a launch's ranks then import neither ``datasets`` nor the tokenizer."""
    import torch

    path = paths.data_dir() / "tokens" / f"emotion_{train_size}_{eval_size}_{vocab_size}_{max_length}.pt"
    if not path.exists():
        splits = emotion_dataset(train_size, eval_size, seed=0)
        tokenizer = cached_wordpiece(f"emotion_{train_size}_{vocab_size}", splits["train"]["text"], vocab_size)
        tokens = {"vocabulary": len(tokenizer),
                  **{s: dict(tokenize(splits[s], tokenizer, max_length)[:]) for s in ("train", "eval")}}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp{random.getrandbits(32)}")
        torch.save(tokens, tmp)
        tmp.replace(path)         # complete when it appears; the same bytes whoever wrote them
    return torch.load(path)


# ---------------------------------------------------------------- notebook 09: the checkpoint stream

def sample(index: int):
    """Sequence ``index`` of the checkpoint data: an arithmetic progression modulo the vocabulary of
    ``tiny_gpt2("checkpoints")`` (learnable)."""
    import torch

    p = preset("checkpoints")
    g = torch.Generator().manual_seed(index)
    start, stride = torch.randint(0, p.vocab_size, (2,), generator=g).tolist()
    return (start + (stride % 7 + 1) * torch.arange(p.seq_len)) % p.vocab_size


def global_batch(step: int, batch_size: int):
    """The samples of training step ``step`` (0-based): the same for any number of ranks, so a resumed
    run sees exactly the batches an uninterrupted run sees."""
    import torch

    return torch.stack([sample(step * batch_size + i) for i in range(batch_size)])


def rank_slice(batch, rank: int, world_size: int):
    """This rank's micro-batch of a global batch (contiguous shards, so 2 ranks × 4 == 1 rank × 8)."""
    if len(batch) % world_size:
        raise ValueError(f"A global batch of {len(batch)} does not split over {world_size} ranks: "
                         f"choose a batch size that is a multiple of the number of ranks.")
    per_rank = len(batch) // world_size
    return batch[rank * per_rank:(rank + 1) * per_rank]


def fixed_batch():
    """The batch on which exported models are compared (never used for training)."""
    import torch

    return torch.stack([sample(10_000_000 + i) for i in range(4)])


# ---------------------------------------------------------------- notebooks 07-08 and 06-07

def counting_dataset(rows: int = 64, seed: int = 0):
    """A ``datasets.Dataset`` for ``tiny_gpt2("trainer")``: token sequences that count upwards from a
    random start (learnable)."""
    import numpy as np
    from datasets import Dataset

    p = preset("trainer")
    starts = np.random.default_rng(seed).integers(0, p.vocab_size, rows)
    ids = [[(int(s) + i) % p.vocab_size for i in range(p.seq_len)] for s in starts]
    return Dataset.from_dict({"input_ids": ids, "labels": ids}).with_format("torch")


def random_batch(step: int, rank: int, batch: int = 8, classes: int = 4):
    """A reproducible batch for ``models.tiny_mlp`` that differs per step and per rank (each rank sees
    its own shard)."""
    import torch

    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(batch, 16, generator=g)
    return x, (x[:, :classes].argmax(dim=1))          # a learnable rule: the largest of the first features


def classification_report(labels, predictions, names: list[str], digits: int = 3) -> str:
    """Per-class precision, recall, F1 and support, then accuracy and the macro and support-weighted averages:
    the table a common tutorial prints with ``sklearn.metrics.classification_report`` (same layout, same
    definitions, 0 where a class was never predicted), from two integer tensors."""
    import torch

    labels, predictions = labels.long().flatten(), predictions.long().flatten()
    rows = []
    for k in range(len(names)):
        tp = int(((predictions == k) & (labels == k)).sum())
        predicted, support = int((predictions == k).sum()), int((labels == k).sum())
        precision = tp / predicted if predicted else 0.0
        recall = tp / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        rows.append((names[k], precision, recall, f1, support))
    total = sum(r[4] for r in rows)
    accuracy = float((predictions == labels).float().mean()) if total else 0.0
    width = max(len(n) for n in names + ["weighted avg"])
    line = lambda name, values, support: (f"{name:>{width}} " + "".join(f"{v:>10.{digits}f}" if v is not None else " " * 10
                                                                        for v in values) + f"{support:>10}")
    averages = [("macro avg", [sum(r[i] for r in rows) / len(rows) for i in (1, 2, 3)]),
                ("weighted avg", [sum(r[i] * r[4] for r in rows) / max(total, 1) for i in (1, 2, 3)])]
    out = [f"{'':>{width}} {'precision':>10}{'recall':>10}{'f1-score':>10}{'support':>10}", ""]
    out += [line(n, (p, r, f), s) for n, p, r, f, s in rows] + [""]
    out += [line("accuracy", (None, None, accuracy), total)]
    out += [line(name, values, total) for name, values in averages]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- notebook 02: the emotion classifier

def width_scaled_std(hidden_size: int, bert_base_std: float = 0.02, bert_base_width: int = 768) -> float:
    """The std of BERT's initial weights (``initializer_range``, 0.02, chosen for bert-base's 768-wide layers) scaled to
    layers ``hidden_size`` wide, so that each layer passes on as much of its input as bert-base's do: a linear layer
    multiplies the size of a normalised input by about std × √width (0.02 × √768 ≈ 0.55; at width 64, 0.02 gives 0.16)."""
    return bert_base_std * (bert_base_width / hidden_size) ** 0.5


def emotion_classifier(vocab_size: int, seed: int):
    """Notebook 02's classifier: ``models.tiny_bert_classifier`` for the six emotion labels, its weights (linear layers
    and embeddings, drawn with std ``initializer_range``) scaled to :func:`width_scaled_std` of its width.

    With BERT's 0.02 at width 64 the untrained model's output hardly depends on the sentence, so the gradients that
    would teach it which words matter start as small; two epochs can then end before it tells apart classes whose
    sentences share a frame ("i am furious about …", "i am disgusted by …"): a class it never predicts, and which one
    depends on the seed and on the ids the tokenizer gave the words."""
    import torch

    from course_utils.rank.models import tiny_bert_classifier

    model = tiny_bert_classifier(vocab_size, len(EMOTION_LABELS), labels=EMOTION_LABELS, seed=seed)
    scale = width_scaled_std(model.config.hidden_size) / model.config.initializer_range
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                module.weight.mul_(scale)          # the same draw, with the larger std (the padding row stays 0)
    model.config.initializer_range *= scale
    return model
