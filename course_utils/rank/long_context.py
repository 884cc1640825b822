"""Inside the ranks of notebook 17: a tiny Llama built from a config, long synthetic sequences it can learn, and the
pieces of Arctic Long Sequence Training (ALST, ``deepspeed/runtime/sequence_parallel/ulysses_sp.py``) wired as its
authors wire them for a Hugging Face model.

The data: each sample is a block of ``PERIOD`` tokens drawn at random (frequent tokens more often, as in text: the
k-th most frequent with weight 1/k) and repeated to the sequence's length, so after the first block every token is
predictable from the token ``PERIOD`` places back — attention has to look far, across the boundaries where sequence
parallelism cuts the sequence — and the loss falls from the first steps, which learn how often each token comes.
"""
from __future__ import annotations

import torch

from course_utils.common.records.long_context import (FFN, HEADS, HIDDEN, KV_HEADS, LAYERS, LR, PERIOD, POSITIONS,
    PROMPT, VOCAB, CLIP)


def llama_config(heads: int = HEADS, kv_heads: int = KV_HEADS):
    """The course's tiny Llama: ``sdpa`` attention (Ulysses needs an implementation that takes no 4-D mask), untied
    embeddings, no dropout."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=POSITIONS,
                       attn_implementation="sdpa", tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                       pad_token_id=0)


def build(seed: int = 0, heads: int = HEADS, kv_heads: int = KV_HEADS):
    """A ``LlamaForCausalLM`` with the same initial weights for every ``seed`` on every rank."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(heads, kv_heads))


def sample(index: int, seq_len: int) -> dict:
    """Sample ``index``: a random block of PERIOD tokens repeated to ``seq_len``; labels are the inputs (the model
    shifts them, or the caller does), position ids 0..seq_len-1 (Ulysses needs them: after its all-to-all each rank
    attends over the whole sequence and must know every token's global position)."""
    g = torch.Generator().manual_seed(1000 + index)
    weights = 1.0 / torch.arange(1, VOCAB, dtype=torch.float64)
    block = 1 + torch.multinomial(weights, PERIOD, replacement=True, generator=g)
    ids = block.repeat(seq_len // PERIOD + 1)[:seq_len]
    labels = ids.clone()
    labels[:PROMPT] = -100             # the first block cannot be predicted from anything before it: not trained on
    return {"input_ids": ids, "labels": labels, "position_ids": torch.arange(seq_len)}


def batches(count: int, seq_len: int, first: int = 0) -> list[dict]:
    """``count`` batches of one sample each (``[1, seq_len]`` tensors), samples ``first``, ``first`` + 1, …"""
    return [{k: v.unsqueeze(0) for k, v in sample(first + i, seq_len).items()} for i in range(count)]


def token_loss_sum(logits: torch.Tensor, shift_labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the token losses, number of tokens with a label) of ``logits`` against labels already shifted
    (``shift_labels[t]`` is the token that follows token t; -100 where none does)."""
    loss = torch.nn.functional.cross_entropy(logits.float().view(-1, logits.shape[-1]), shift_labels.view(-1),
                                             ignore_index=-100, reduction="sum")
    return loss, (shift_labels != -100).sum()


def reference(seq_len: int, steps: int, seed: int = 0, clip: float = CLIP) -> tuple[list[float], list[float]]:
    """The same model trained in this process alone, without DeepSpeed or sequence parallelism: whole sequences, the
    mean token loss, ``torch.optim.AdamW`` at the course's learning rate, one sample per step in the order the
    Ulysses adapter hands them out (every SP rank works on sample 0, then all on sample 1, …), the gradient clipped to
    a norm of ``clip`` as DeepSpeed clips it (``gradient_clipping``, whose default in this DeepSpeed is 1.0:
    ``GRADIENT_CLIPPING_DEFAULT`` in ``deepspeed/runtime/constants.py``). Returns (losses, gradient norms before
    clipping) per step."""
    model = build(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses, norms = [], []
    for batch in batches(steps, seq_len):
        loss = model(input_ids=batch["input_ids"], labels=batch["labels"], position_ids=batch["position_ids"]).loss
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses, norms
