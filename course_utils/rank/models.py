"""Tiny models built from configs (nothing is downloaded): the same classes as the real checkpoints,
sizes small enough to train on two CPU cores.

The course's GPT-2s are named by what they are for (:data:`PRESETS`): ``tiny_gpt2("zero_lab")`` for
the ZeRO experiments of notebooks 03-05, ``tiny_gpt2("checkpoints")`` for notebook 09,
``tiny_gpt2("trainer")`` for the Trainer runs of notebooks 07-08. Each preset also fixes the data
that goes with it (vocabulary, sequence length), which :mod:`course_utils.rank.data` reads from here.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPT2Preset:
    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    seq_len: int                        # tokens per training sequence of the data that goes with it
    dropout: float | None = None        # 0.0: a step depends only on weights, optimizer state and batch
    special_token_id: int | None = None  # bos/eos inside the small vocabulary (GPT-2's 50256 lies outside)
    purpose: str = ""

    @property
    def params(self) -> int:
        """Parameters of a ``GPT2LMHeadModel`` of this shape (the output layer shares the embedding's weight): token
        and position embeddings, per block two LayerNorms (4d), attention (4d² + 4d) and the MLP (8d² + 5d), and the
        final LayerNorm."""
        d = self.n_embd
        return (self.vocab_size + self.n_positions) * d + self.n_layer * (12 * d * d + 13 * d) + 2 * d


PRESETS = {
    "zero_lab": GPT2Preset(8192, 128, 384, 6, 6, seq_len=32, dropout=0.0, special_token_id=8191,
                           purpose="~13.8 M parameters: model states dwarf everything else, small enough for 2 CPU cores"),
    "checkpoints": GPT2Preset(64, 16, 64, 2, 2, seq_len=16, dropout=0.0, special_token_id=0,
                              purpose="~0.1 M parameters without dropout: a resumed run repeats the uninterrupted one"),
    "trainer": GPT2Preset(64, 16, 32, 2, 2, seq_len=16, special_token_id=63,
                          purpose="~28 k parameters with GPT-2's default dropout, for short Trainer runs"),
}


# GPT-2's own shapes (``gpt2``, ``gpt2-medium``, ``gpt2-large``: vocabulary 50257, 1024 positions), built from configs
# like the tiny ones, smallest first: what a lesson whose point is speed or memory trains on a GPU, so that the device is
# busy and the trade-offs show (``course_utils.kernel.hardware.model_size`` picks one for the machine)
GPU_SIZES = {
    "gpt2": GPT2Preset(50257, 1024, 768, 12, 12, seq_len=512, dropout=0.0, special_token_id=50256,
                       purpose="GPT-2 small, ~124 M parameters"),
    "gpt2-medium": GPT2Preset(50257, 1024, 1024, 24, 16, seq_len=512, dropout=0.0, special_token_id=50256,
                              purpose="GPT-2 medium, ~355 M parameters"),
    "gpt2-large": GPT2Preset(50257, 1024, 1280, 36, 20, seq_len=512, dropout=0.0, special_token_id=50256,
                             purpose="GPT-2 large, ~774 M parameters"),
}
SIZE_ENV = "COURSE_MODEL_SIZE"    # set by a notebook for the launches it sizes for a GPU (``hardware.sized_env``)


def preset(name: str, size: str | None = None) -> GPT2Preset:
    """The preset a rank builds for ``name``: the course's tiny one, or the GPU size ``size`` names, else the one its
    launch was given (``COURSE_MODEL_SIZE``, one of :data:`GPU_SIZES`), whichever preset the script asks for. A
    notebook passes ``size`` (``hardware.model_size``) to count what its sized launch builds."""
    import os

    if name not in PRESETS:
        raise KeyError(f"No GPT-2 preset {name!r}; the course has {sorted(PRESETS)}")
    size = size or os.environ.get(SIZE_ENV)
    if not size:
        return PRESETS[name]
    if size not in GPU_SIZES:
        raise KeyError(f"{SIZE_ENV}={size!r} names no GPU size; the course has {sorted(GPU_SIZES)}")
    return GPU_SIZES[size]


def tiny_gpt2(name: str, seed: int = 0, size: str | None = None):
    """A ``GPT2LMHeadModel`` of preset ``name`` with random weights from ``seed`` (``gpt2`` is
    50257/1024/768/12/12): the same seed gives the same weights on every rank. In a launch sized for a GPU
    (:func:`preset`), or given ``size``, it has that GPU size's shape (build it under ``torch.device("meta")`` to count
    it without the memory)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    p = preset(name, size)
    extra = {}
    if p.dropout is not None:
        extra.update(resid_pdrop=p.dropout, embd_pdrop=p.dropout, attn_pdrop=p.dropout)
    if p.special_token_id is not None:
        extra.update(bos_token_id=p.special_token_id, eos_token_id=p.special_token_id)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=p.vocab_size, n_positions=p.n_positions, n_embd=p.n_embd, n_layer=p.n_layer,
                        n_head=p.n_head, **extra)
    return GPT2LMHeadModel(config)


def tiny_bert_classifier(vocab_size: int, num_labels: int, hidden_size: int = 64, num_layers: int = 2,
                         num_heads: int = 2, intermediate_size: int = 128, max_positions: int = 64,
                         labels: list[str] | None = None, seed: int | None = None, dropout: float = 0.1):
    """A ``BertForSequenceClassification`` with random weights (``bert-base`` is 768/12/12/3072).

    ``labels`` names the classes (stored as id2label, so reports and ``save_pretrained`` keep them);
    ``seed`` makes the initial weights repeatable (two ranks must start from the same model).
    """
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    if labels is not None and len(labels) != num_labels:
        raise ValueError(f"{len(labels)} label names given for num_labels={num_labels}")
    config = BertConfig(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                        num_attention_heads=num_heads, intermediate_size=intermediate_size,
                        max_position_embeddings=max_positions, num_labels=num_labels,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                        id2label=dict(enumerate(labels)) if labels else None,
                        label2id={name: i for i, name in enumerate(labels)} if labels else None)
    if seed is not None:
        torch.manual_seed(seed)
    return BertForSequenceClassification(config)


def tiny_mlp(seed: int = 0, width: int = 32, classes: int = 4):
    """A small classifier (16 → width → classes) for the precision and optimizer experiments (06, 07)."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, classes))


def count_parameters(model) -> int:
    """Number of trainable parameters (Ψ; tied weights counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
