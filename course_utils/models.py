"""Tiny transformer models built from configs (nothing is downloaded): same classes as the real
checkpoints, sizes small enough to train on two CPU cores in seconds."""
from __future__ import annotations


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


def tiny_gpt2(vocab_size: int, n_positions: int, n_embd: int, n_layer: int, n_head: int, seed: int = 0,
              dropout: float | None = None, special_token_id: int | None = None):
    """A ``GPT2LMHeadModel`` with random weights from ``seed`` (``gpt2`` is 50257/1024/768/12/12).

    ``dropout=0.0`` removes every dropout, so a training step depends only on weights, optimizer state
    and batch (None keeps GPT-2's defaults); ``special_token_id`` sets bos/eos inside a small vocabulary.
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    extra = {}
    if dropout is not None:
        extra.update(resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout)
    if special_token_id is not None:
        extra.update(bos_token_id=special_token_id, eos_token_id=special_token_id)
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer,
                        n_head=n_head, **extra)
    return GPT2LMHeadModel(config)


def count_parameters(model) -> int:
    """Number of trainable parameters (Ψ; tied weights counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
