"""A transformers MoE model (tiny OLMoE and Mixtral, built from their configs) trained at ZeRO-3 on every rank, on
sequences that count up by one (``course_utils.rank.moe.lm_batch``), without and with ``zero_optimization.leaf_module``
naming its sparse block: how each run ends, its losses, and the parameter fetches of one step. Then the same OLMoE with
its sparse blocks replaced by blocks that keep their experts in a list and run only the chosen ones
(``course_utils.rank.moe.ExpertListBlock``), on 4 random ids per rank and step (``random_ids``: nothing to learn,
what its runs compare is the losses): trained by plain PyTorch in one process on every rank's tokens at once (the
losses a working ZeRO-3 run of it must give), then at ZeRO-3 with the section your ``leaf_module_section()`` returns
(--yours; notebook 15's exercise 3, whose answer this script does not hold). Then DeepSpeed's AutoEP asked to split
the Mixtral's experts over the ranks; and last the expert-list model at ZeRO-3 without a leaf module: its ranks fail,
and so does the launch.

Run from a terminal:
  deepspeed --num_gpus 2 scripts/15_moe_zero3.py --deepspeed_config configs/15_moe_zero3.json
"""
import argparse
import copy
import gc
import time

import deepspeed
import torch
import torch.distributed as dist
from deepspeed.utils.z3_leaf_module import get_z3_leaf_modules

from course_utils.common.record import record
from course_utils.common.records.moe import Zero3Run
from course_utils.rank import moe as m
from course_utils.rank.engine import release
from course_utils.rank.scaffolding import finish, load_config, load_exercise, parse_args, rank0_print


def train(label: str, family: str, config: dict, steps: int, expert_lists: bool = False) -> None:
    model = m.tiny_moe_lm(family)
    if expert_lists:
        model = m.with_expert_lists(model)
    block = m.sparse_block(model)
    blocks = sum(isinstance(module, block) for module in model.modules())
    leaf = config["zero_optimization"].get("leaf_module")
    losses, fetches, ms = [], 0, 0.0
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        leaves = len(get_z3_leaf_modules(engine.module))
        for s in range(steps):
            ids = (m.random_ids(s, dist.get_rank()) if expert_lists else m.lm_batch(s, dist.get_rank())).to(engine.device)
            with m.FetchCounter() as counter:
                start = time.perf_counter()
                loss = engine(input_ids=ids, labels=ids).loss
                engine.backward(loss)
                engine.step()
                elapsed = time.perf_counter() - start
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            losses.append(mean.item() / dist.get_world_size())
            if s == steps - 1:                        # the last step: ZeRO-3's trace of the modules is settled
                fetches, ms = counter.count, 1000 * elapsed
        outcome = "trained"
        release(engine)
    except Exception as error:                        # noqa: BLE001 - whatever DeepSpeed raised is the finding
        outcome, leaves = f"{type(error).__name__}: {error}", 0
    record(Zero3Run(label=label, family=family, block=f"{block.__module__}.{block.__qualname__}",
                    leaf_section=leaf, leaf_modules=leaves, blocks=blocks,
                    outcome=outcome, losses=losses, fetches=fetches, step_ms=ms))
    rank0_print(f"{label}: {outcome}; {fetches} fetches in one step")


def without_deepspeed(config: dict, steps: int) -> None:
    """The expert-list model trained by plain PyTorch in this one process, on every rank's tokens at once, with AdamW
    at the config's settings: the losses a working ZeRO-3 run of it must give (the mean of the ranks' losses, and
    their gradients averaged, are the loss and the gradient of the batch of all their tokens)."""
    model = m.with_expert_lists(m.tiny_moe_lm("OLMoE"))
    optimizer = torch.optim.AdamW(model.parameters(), **config["optimizer"]["params"])
    losses = []
    for s in range(steps):
        ids = torch.cat([m.random_ids(s, r) for r in range(dist.get_world_size())])
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        for p in model.parameters():      # an engine steps every parameter: one no token chose has a zero gradient
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    block = m.sparse_block(model)
    record(Zero3Run(label="expert lists, without DeepSpeed", family="OLMoE", block=f"{block.__module__}.{block.__qualname__}",
                    leaf_section=None, leaf_modules=0, blocks=sum(isinstance(x, block) for x in model.modules()),
                    outcome="trained", losses=losses))


def autoep(base: dict) -> str:
    """AutoEP (``"expert_parallel": {"enabled": true, "autoep_size": 2}``) asked to split the tiny Mixtral's experts
    over the ranks at ZeRO-2, and one training step: "" if it trains, else what was raised."""
    config = copy.deepcopy(base)
    config["zero_optimization"] = {"stage": 2}
    config["expert_parallel"] = {"enabled": True, "autoep_size": dist.get_world_size()}
    model = m.tiny_moe_lm("Mixtral")
    try:
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        ids = m.lm_batch(0, dist.get_rank()).to(engine.device)
        engine.backward(engine(input_ids=ids, labels=ids).loss)
        engine.step()
    except Exception as error:                        # noqa: BLE001 - whatever was raised is the finding
        return f"{type(error).__name__}: {error}"
    release(engine)
    return ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--yours", help="a file defining leaf_module_section()")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    base = load_config(args)
    deepspeed.init_distributed()
    torch.set_num_threads(1)
    gc.freeze()
    olmoe_block = f"{m.sparse_block(m.tiny_moe_lm('OLMoE')).__module__}.OlmoeSparseMoeBlock"
    for family in ("Mixtral", "OLMoE"):
        train(f"{family}, leaf_module defaults", family, base, args.steps)
        none = copy.deepcopy(base)
        none["zero_optimization"]["leaf_module"] = {"classes": []}
        train(f"{family}, no leaf module", family, none, args.steps)
    named = copy.deepcopy(base)
    named["zero_optimization"]["leaf_module"] = {"classes": [olmoe_block]}
    train("OLMoE, its block named", "OLMoE", named, args.steps)
    without_deepspeed(base, args.steps)
    if args.yours:
        section = load_exercise(args.yours, ["leaf_module_section"])["leaf_module_section"]()
        mine = copy.deepcopy(base)
        mine["zero_optimization"]["leaf_module"] = section
        train("expert lists, yours", "OLMoE", mine, args.steps, expert_lists=True)
    record("autoep_error", autoep(base))
    dist.barrier()                                    # every record above is written before the last run
    train("expert lists, no leaf module", "OLMoE", base, args.steps, expert_lists=True)
    finish()


if __name__ == "__main__":
    main()
