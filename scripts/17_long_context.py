"""Long context on 2 ranks: Ulysses sequence parallelism (ALST) for a Hugging Face model, in one launch.

1. Rank 0 trains the model alone, without DeepSpeed or sequence parallelism: the reference losses and gradient norms.
2. DeepSpeed's head rules: ``UlyssesSPAttentionHF`` built for head layouts over this launch's SP group.
3. The same model, the same samples, sequence-parallel over every rank of the launch (SP size = world size): ZeRO-3,
   ``register_with_transformers``, ``mpu`` to ``deepspeed.initialize``, and per run one way of sharding the samples and
   of computing the loss:
   - "adapter": DeepSpeed's ``UlyssesSPDataLoaderAdapter`` and transformers' own SP loss (``deepspeed_sp_compute_loss``,
     what the Trainer uses);
   - "tutorial": the loop of a common tutorial, which shards each sample and then shifts its labels (``--tutorial``);
   - "yours": your ``shard`` and ``sp_loss`` (``--yours``, notebook 17's exercises).
   Each run records per step the tokens each rank held, the loss over the whole sequence, the gradient norm, and the
   bytes of one step's all-to-alls (DeepSpeed's comms logger).
4. With ``--grow``: every rank puts itself under its own limit of ``--cap_mb`` MiB of tensors (as in
   ``scripts/17_longest_sequence.py``) and trains sequences of the lengths given, in order, until the limit ends the
   launch — notebook 17's longest sequence at this SP size.

Run from a terminal:
  deepspeed --num_gpus 2 scripts/17_long_context.py --deepspeed_config configs/17_long_context.json
"""
import argparse
import gc

import deepspeed
import torch
import torch.distributed as dist

from course_utils.common.record import record
from course_utils.common.records.long_context import HeadRule, Reference, Shape, SpRun
from course_utils.common.records.long_context_memory import KERNEL, KERNELS
from course_utils.rank import comms
from course_utils.rank import long_context as lc
from course_utils.rank import sequence_memory
from course_utils.rank.engine import release
from course_utils.rank.scaffolding import finish, load_config, load_exercise, parse_args, rank0_print

HEAD_LAYOUTS = [(4, 2), (4, 1), (3, 1), (4, 3)]     # (query heads, key/value heads) tried against DeepSpeed's rules


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seq_len", type=int, default=1024, help="tokens per sample")
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps (one sample each)")
    parser.add_argument("--runs", nargs="+", default=["adapter", "tutorial"], choices=["adapter", "tutorial", "yours"])
    parser.add_argument("--tutorial", default=None, help="a file defining the tutorial's tutorial_shard(sample, sp_rank, sp_size)")
    parser.add_argument("--yours", nargs="*", default=[], help="files defining your shard(...) and sp_loss(...)")
    parser.add_argument("--no_reference", action="store_true", help="skip the one-process reference")
    parser.add_argument("--grow", type=int, nargs="*", default=[], help="lengths to train under the limit, in order")
    parser.add_argument("--cap_mb", type=int, default=0, help="each rank's limit of tensors for --grow, MiB")
    parser.add_argument("--kernel", default=KERNEL, choices=KERNELS, help="the attention kernel of --grow")
    return parser


def head_rules(sp_group) -> None:
    """Build DeepSpeed's attention wrapper for each head layout; it checks the heads against the SP size itself."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

    sp = dist.get_world_size(sp_group)
    for heads, kv in HEAD_LAYOUTS:
        try:
            a = UlyssesSPAttentionHF(attn=None, batch_size=1, attn_head_count=heads, attn_head_size=16,
                                     kv_head_count=kv, num_hidden_layers=1, process_group=sp_group,
                                     local_seq_length=8, global_seq_length=8 * sp)
            rule = HeadRule(heads, kv, sp, None, a.local_q_head_count, a.local_kv_head_count)
        except ValueError as e:
            rule = HeadRule(heads, kv, sp, str(e))
        if dist.get_rank() == 0:
            record(rule)


def run(label: str, config: dict, mpu, seq_len: int, steps: int, shard=None, sp_loss=None) -> None:
    """One sequence-parallel training run from the same initial weights (see the module's docstring)."""
    from accelerate.parallelism_config import ParallelismConfig
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
    from deepspeed.utils import groups
    from transformers.integrations.deepspeed import deepspeed_sp_compute_loss

    sp, rank = dist.get_world_size(), dist.get_rank()
    model = lc.build()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config, mpu=mpu)
    group, sp_rank = groups._get_sequence_parallel_group(), groups._get_sequence_parallel_rank()
    if shard is None:       # DeepSpeed's adapter: each rank's loader holds samples rank, rank + sp, …
        mine = [lc.sample(i, seq_len) for i in range(rank, steps, sp)]
        loader = torch.utils.data.DataLoader(mine, batch_size=1)
        batches = UlyssesSPDataLoaderAdapter(loader, sp_rank=sp_rank, sp_group=group, sp_world_size=sp,
                                             device=engine.device)
    else:                   # a hand-written loop: every rank takes every sample and cuts its own piece
        batches = (shard({k: v.unsqueeze(0) for k, v in lc.sample(i, seq_len).items()}, sp_rank, sp)
                   for i in range(steps))
    pc = ParallelismConfig(sp_backend="deepspeed", sp_size=sp)
    out = SpRun(label, rank, sp, seq_len, [], [], [], [])
    for step, batch in zip(range(steps), batches):
        inputs = {k: batch[k].to(engine.device) for k in ("input_ids", "position_ids", "shift_labels")}
        with comms.logged() as window:
            if sp_loss is None:
                loss = deepspeed_sp_compute_loss(None, engine, dict(inputs), False, pc)
                mean = loss.detach()
            else:
                logits = engine(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"]).logits
                loss_sum, count = lc.token_loss_sum(logits, inputs["shift_labels"])
                both = torch.stack([loss_sum.detach(), count.float()])    # copied before sp_loss: an all_reduce of
                loss = sp_loss(loss_sum, count, group)                     # count in place there changes no log
                dist.all_reduce(both, group=group)
                mean = both[0] / both[1]
            engine.backward(loss)
            engine.step()
        if step == 1 or steps == 1:
            out.alltoall = window.messages.get("all_to_all_single", {})
        if step == 0:
            out.edges = {"last_labels": inputs["shift_labels"][0, -2:].tolist(),
                         "first_ids": inputs["input_ids"][0, :2].tolist()}
            if label == "adapter":
                out.shards.append({k: v.view(-1).tolist() for k, v in inputs.items()})
        out.local_tokens.append(inputs["input_ids"].shape[1])
        out.labelled.append(int((inputs["shift_labels"] != -100).sum()))
        out.losses.append(float(mean))
        out.grad_norms.append(float(engine.get_global_grad_norm()))
    record(out)
    rank0_print(f"{label:9s} SP {sp}: {out.local_tokens[0]} of {seq_len} tokens on each rank, "
                f"loss {out.losses[0]:.4f} → {out.losses[-1]:.4f}")
    release(engine)


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    deepspeed.init_distributed()
    config = comms.with_comms_logger(load_config(args))
    if dist.get_rank() == 0 and not args.no_reference:
        losses, norms = lc.reference(args.seq_len, args.steps)
        record(Reference(args.seq_len, losses, norms))
        shape = lc.llama_config()
        record(Shape(shape.num_hidden_layers, shape.num_attention_heads, shape.num_key_value_heads,
                     shape.hidden_size // shape.num_attention_heads))
        rank0_print(f"one process, no SP: loss {losses[0]:.4f} → {losses[-1]:.4f}")
    head_rules(dist.group.WORLD)
    # once per process, after the reference: from here on transformers' "sdpa" is DeepSpeed's wrapper around it
    # (register_with_transformers replaces the entry in ALL_ATTENTION_FUNCTIONS), and the SP groups exist
    mpu = sequence_memory.register(dist.get_world_size())
    # what the process holds now (the libraries' modules) lives until it ends: frozen, it leaves each engine's
    # release (a garbage collection) only the objects made since
    gc.collect()
    gc.freeze()
    for label in args.runs:
        if label == "adapter":
            run(label, config, mpu, args.seq_len, args.steps)
        elif label == "tutorial":
            run(label, config, mpu, args.seq_len, args.steps, shard=load_exercise(args.tutorial, ["tutorial_shard"])["tutorial_shard"])
        else:
            yours = {}
            for path in args.yours:
                yours.update(load_exercise(path, ["shard", "sp_loss"]))
            run(label, config, mpu, args.seq_len, args.steps, shard=yours.get("shard"), sp_loss=yours.get("sp_loss"))
    if args.grow:
        grow(args, mpu)
    finish()


def grow(args: argparse.Namespace, mpu) -> None:
    """Section 4 of the module's docstring: the limit, then lengths until it ends the launch."""
    from course_utils.rank.engine import training_dtype

    limit, meter = sequence_memory.count_limit(args.cap_mb)
    sp = dist.get_world_size()
    with meter.counter:
        engine = sequence_memory.engine_for(sp, training_dtype(), mpu)
        sequence_memory.grow(engine, sp, args.grow, 1, meter, limit.cap_bytes, kernel=args.kernel)


if __name__ == "__main__":
    main()
