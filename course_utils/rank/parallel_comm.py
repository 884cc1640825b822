"""Sequence and tensor parallelism and ZeRO++ inside the ranks (notebook 13).

- DeepSpeed-Ulysses: ``deepspeed.sequence.layer.DistributedAttention`` around plain attention, each rank holding
  1/p of the sequence; its output against attention over the whole sequence on one rank, and the all-to-alls it
  sends (DeepSpeed's comms logger).
- AutoTP: the ``tensor_parallel`` config section on the course's GPT-2 (DeepSpeed's own error kept) and on a
  tiny Llama built from a config: which weights it splits, each rank's bytes, the logits of the unsplit model.
- ZeRO++ hpZ: ZeRO-3's parameter all-gathers counted by the group they run in (a wrapper around
  ``_dist_allgather_fn`` of ``runtime/zero/partition_parameters.py``, which every gather calls).
"""
from __future__ import annotations

from course_utils.common.records.parallel import Gathers, TensorParallel, Ulysses

HEADS, HEAD_DIM, SEQ, BATCH = 4, 16, 64, 2      # attention of Ulysses' check: 64 wide, 64 tokens, 2 sequences


def local_attention(q, k, v, *args, **kwargs):
    """Causal attention over (batch, sequence, heads, head dim) tensors."""
    import torch.nn.functional as F

    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


def ulysses_check() -> Ulysses:
    """Ulysses over every rank: q, k, v of the whole sequence on every rank (same generator), each rank feeds
    DistributedAttention its slice of the sequence, and compares its output slice with one-rank attention."""
    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.sequence.layer import DistributedAttention

    from course_utils.rank import comms

    p, r = dist.get_world_size(), dist.get_rank()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, generator=g, requires_grad=True) for _ in range(3))
    seen = []

    def observed(q_, k_, v_, *a, **kw):
        seen.append(list(q_.shape))
        return local_attention(q_, k_, v_)

    attention = DistributedAttention(observed, dist.new_group(list(range(p))), scatter_idx=2, gather_idx=1)
    mine = slice(r * SEQ // p, (r + 1) * SEQ // p)
    deepspeed.comm.configure(enabled=True, prof_all=True, verbose=False, debug=False)
    with comms.logged() as forward:
        out = attention(q[:, mine], k[:, mine], v[:, mine], batch_dim_idx=0)
    with comms.logged() as backward:
        out.sum().backward()
    deepspeed.comm.configure(enabled=False)
    whole = local_attention(q, k, v)[:, mine]
    return Ulysses(p=p, max_abs_diff=(out - whole).abs().max().item(), local_shape=seen[0],
                   forward_alltoall=forward.messages.get("all_to_all_single", {}),
                   backward_alltoall=backward.messages.get("all_to_all_single", {}),
                   shape=[BATCH, SEQ, HEADS, HEAD_DIM], element_bytes=q.element_size())


def tiny_llama():
    """A ``LlamaForCausalLM`` from a config (nn.Linear projections, 4 query and 2 key-value heads), random weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))


def autotp(name: str, model, tp: int) -> TensorParallel:
    """``deepspeed.initialize`` with ``"tensor_parallel": {"autotp_size": tp}`` on ``model``; what it split."""
    import deepspeed
    import torch

    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = model(input_ids=ids).logits
    shapes = {n: list(p.shape) for n, p in model.named_parameters()}
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    config = {"train_micro_batch_size_per_gpu": 2, "tensor_parallel": {"autotp_size": tp},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 0}}
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    except Exception as error:          # DeepSpeed refuses before any collective: every rank sees the same
        return TensorParallel(model=name, error=f"{type(error).__name__}: {error}", split={}, kept=[], rank_bytes=0,
                              whole_bytes=whole, max_abs_diff=-1.0)
    now = {n: list(p.shape) for n, p in engine.module.named_parameters()}
    with torch.no_grad():
        logits = engine(input_ids=ids).logits
    split = {n: [shapes[n], s] for n, s in now.items() if n in shapes and s != shapes[n]}
    return TensorParallel(model=name, error="", split=split, kept=sorted(set(now) - set(split)),
                          rank_bytes=sum(p.numel() * p.element_size() for p in engine.module.parameters()),
                          whole_bytes=whole, max_abs_diff=(logits - reference).abs().max().item())


class GatherCounter:
    """Counts ZeRO-3's parameter all-gathers by where the bytes come from: each member of the gather's group
    sends this rank one shard, from this rank's node or from another (``procs_per_node`` ranks per node)."""

    def __init__(self, procs_per_node: int):
        import deepspeed.runtime.zero.partition_parameters as zero3

        self.procs_per_node, self.log = procs_per_node, []
        self._module, self._plain = zero3, zero3._dist_allgather_fn
        zero3._dist_allgather_fn = self._counted

    def _counted(self, input_tensor, output_tensor, group=None):
        import torch.distributed as dist

        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        self.log.append((tuple(ranks), input_tensor.numel() * input_tensor.element_size()))
        return self._plain(input_tensor, output_tensor, group)

    def result(self, label: str, shard_numel: int) -> Gathers:
        import torch.distributed as dist

        me = dist.get_rank()
        intra = inter = 0
        sizes: dict[str, int] = {}
        for ranks, size in self.log:
            sizes[str(len(ranks))] = sizes.get(str(len(ranks)), 0) + size
            for other in ranks:
                if other != me and other // self.procs_per_node == me // self.procs_per_node:
                    intra += size
                elif other != me:
                    inter += size
        return Gathers(label=label, intra_node=intra, inter_node=inter, by_group_size=sizes, shard_numel=shard_numel)

    def close(self) -> None:
        self._module._dist_allgather_fn = self._plain
