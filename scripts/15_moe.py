"""DeepSpeed's MoE layer on CPU or GPU ranks, in one launch.

1. Routing (rank 0 alone): one forward of an MoE layer with top-1 and top-2 gating at several capacity factors:
   the capacity, the expert counts and the tokens that came out without an expert.
2. The auxiliary load-balancing loss: the same model trained with and without it, the expert counts of each step.
3. Expert-parallel layouts: for each ``ep_size``, which experts each rank holds, the groups DeepSpeed built, the
   bytes of the all-to-alls of one step (comms logger), and the losses of a few steps.
4. ZeRO-0/1/2 with experts: what each rank holds; a torch optimizer without MoE param groups (DeepSpeed's answer).
   With --yours, your ``moe_zero2(model)`` at ZeRO-2: the groups of your optimizer, DeepSpeed's answer, the losses.
5. A checkpoint of the expert-parallel model at ZeRO-2: the files each rank wrote, and a resume.

Run from a terminal:
  deepspeed --num_gpus 2 scripts/15_moe.py --deepspeed_config configs/15_moe.json
"""
import argparse
import gc
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

from course_utils.common import run_folder
from course_utils.common.record import record
from course_utils.common.records.moe import Balance, CheckpointFile, Layout, Routing, StageState
from course_utils.rank import comms
from course_utils.rank import moe as m
from course_utils.rank.engine import release
from course_utils.rank.memory import model_state_bytes, tensor_inventory
from course_utils.rank.scaffolding import finish, load_config, load_exercise, parse_args, rank0_print, scratch_dir


def config_at(base: dict, stage: int) -> dict:
    """The launch's config at ZeRO ``stage``, with the comms logger on."""
    cfg = comms.with_comms_logger(base)
    cfg["zero_optimization"] = {**cfg["zero_optimization"], "stage": stage}
    return cfg


def routing(tokens: int) -> None:
    if dist.get_rank() != 0:
        return
    for k in (1, 2):
        for cf in (0.5, 1.0, 2.0):
            r = m.routing(k, cf, tokens)
            record(Routing(k=k, capacity_factor=cf, tokens=tokens, experts=4, min_capacity=4, **r))


def balance(base: dict, steps: int) -> None:
    """The same expert-parallel model trained without and with the auxiliary loss: the counts of each step."""
    for coef in (0.0, 0.1):
        model = m.build(4, 2)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=base)
        counts, aux, losses = [], [], []
        for s in range(steps):
            loss, c, l_aux = m.train_step(engine, s, coef)
            counts.append(c.int().tolist())
            aux.append(l_aux)
            losses.append(loss)
        record(Balance(aux_coef=coef, counts=counts, l_aux=aux, losses=losses))
        release(engine)


def layout(base: dict, label: str, experts: int, ep_size: int, k: int, cf: float, ffn: int, steps: int) -> None:
    """One expert-parallel layout: what this rank holds, its groups, the all-to-all bytes of one step, the losses."""
    model = m.build(experts, ep_size, k=k, capacity_factor=cf, ffn=ffn)
    ep_group, edp_group = m.group_ranks(model)
    expert_numel, dense_numel = m.held_numel(model)
    capacity = m.capacity_of(model.moe)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=config_at(base, 1))
    windows = {}                                      # every collective of one whole step, its forward apart
    losses = [m.train_step(engine, 0)[0], m.train_step(engine, 1, windows=windows)[0]]
    losses += [m.train_step(engine, s)[0] for s in range(2, steps)]
    forward = windows["forward"].messages.get("all_to_all_single", {})
    both = {size: forward.get(size, 0) + windows["backward"].messages.get("all_to_all_single", {}).get(size, 0)
            for size in {*forward, *windows["backward"].messages.get("all_to_all_single", {})}}
    record(Layout(label=label, world_size=dist.get_world_size(), rank=dist.get_rank(), experts=experts,
                  ep_size=ep_size, k=k, capacity_factor=cf, ffn=ffn, hidden=m.HIDDEN, tokens=m.MICRO * m.SEQ,
                  local_experts=m.local_expert_ids(model), expert_numel=expert_numel, dense_numel=dense_numel,
                  one_expert_numel=m.expert_numel(m.HIDDEN, ffn), ep_group=ep_group, expert_dp_group=edp_group,
                  alltoall=both, alltoall_forward=forward, capacity=capacity["C"], losses=losses,
                  optimizer_groups=m.optimizer_groups(engine)))
    rank0_print(f"{label}: rank 0 holds experts {m.local_expert_ids(model)} ({expert_numel:,} parameters)")
    release(engine)


def zero_states(base: dict) -> None:
    """ZeRO-0/1/2 with 4 experts over ep_size 2: the bytes each rank holds after a step and its backward."""
    for stage in (0, 1, 2):
        model = m.build(4, 2)
        expert_numel, dense_numel = m.held_numel(model)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()),
                                          config=config_at(base, stage))
        m.train_step(engine, 0)
        x, y = m.batch(1, dist.get_rank())
        logits, l_aux, _ = engine(x)
        engine.backward(torch.nn.functional.cross_entropy(logits.reshape(-1, m.CLASSES), y.reshape(-1)) + 0.01 * l_aux)
        measured = model_state_bytes(tensor_inventory(engine))
        engine.step()
        record(StageState(stage=stage, rank=dist.get_rank(), expert_numel=expert_numel, dense_numel=dense_numel,
                          measured=measured, optimizer_groups=m.optimizer_groups(engine)))
        release(engine)


def client_optimizer_without_groups(base: dict) -> str:
    """A torch optimizer over ``model.parameters()`` handed to deepspeed.initialize at ZeRO-1: DeepSpeed's answer."""
    model = m.build(4, 2)
    cfg = config_at(base, 1)
    cfg.pop("optimizer")
    try:
        engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3),
                                          config=cfg)
    except AssertionError as error:
        return f"AssertionError: {error}"
    release(engine)
    return ""


def yours(path: str, steps: int) -> None:
    """Your moe_zero2(model) -> (config, optimizer): the groups of your optimizer, the engine it gives (or what
    DeepSpeed raised), trained ``steps`` steps."""
    fn = load_exercise(path, ["moe_zero2"])["moe_zero2"]
    model = m.build(4, 2)
    config, optimizer = fn(model)
    given = m.given_groups(optimizer)
    try:
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    except Exception as error:                        # noqa: BLE001 - what DeepSpeed said is the finding
        record("yours_error", f"{type(error).__name__}: {error}")
        return
    expert_numel, dense_numel = m.held_numel(model)
    losses = [m.train_step(engine, s)[0] for s in range(steps)]
    measured = model_state_bytes(tensor_inventory(engine))
    record(StageState(stage=engine.zero_optimization_stage(), rank=dist.get_rank(), expert_numel=expert_numel,
                      dense_numel=dense_numel, measured=measured, optimizer_groups=m.optimizer_groups(engine),
                      label="yours", losses=losses, given_groups=given,
                      batch={"micro": engine.train_micro_batch_size_per_gpu(),
                             "accumulation": engine.gradient_accumulation_steps(), "clipping": engine.gradient_clipping()}))
    release(engine)


def checkpoint(base: dict, steps: int) -> None:
    """ZeRO-2, 4 experts over ep_size 2: ``steps`` steps, save, 2 more; a fresh engine loads and takes the same 2."""
    folder = (run_folder.current() or Path(scratch_dir("course15-"))) / "checkpoint"
    cfg = config_at(base, 2)
    model = m.build(4, 2)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=cfg)
    record("zero2_losses", [m.train_step(engine, s)[0] for s in range(steps)])
    save = engine.checkpoint_engine.save
    written = []

    def recording_save(state_dict, path):             # DeepSpeed's own writer, each file it is given noted
        written.append(str(path))
        return save(state_dict, path)

    engine.checkpoint_engine.save = recording_save
    engine.save_checkpoint(str(folder), tag="moe")
    dist.barrier()
    for path in written:
        record(CheckpointFile(rank=dist.get_rank(), file=str(Path(path).relative_to(folder)),
                              bytes=Path(path).stat().st_size))
    torch.manual_seed(steps)      # the gate's random token selection draws from torch's generator, which the
    after = [m.train_step(engine, s)[0] for s in range(steps, steps + 2)]      # checkpoint does not hold
    release(engine)
    model = m.build(4, 2)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=cfg)
    engine.load_checkpoint(str(folder), tag="moe")
    torch.manual_seed(steps)
    resumed = [m.train_step(engine, s)[0] for s in range(steps, steps + 2)]
    record("checkpoint_losses", {"continued": after, "resumed": resumed})
    release(engine)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ep-sizes", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--layout", nargs=5, action="append", default=None, metavar=("EXPERTS", "EP", "K", "CF", "FFN"),
                        help="also measure this layout (given twice: the second is labelled as a second layout)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--balance-steps", type=int, default=30)
    parser.add_argument("--layouts-only", action="store_true", help="only section 3 (and --layout, --yours)")
    parser.add_argument("--yours", help="a file defining moe_zero2(model) -> (config, optimizer)")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    base = load_config(args)
    deepspeed.init_distributed()
    torch.set_num_threads(1)
    gc.freeze()
    if not args.layouts_only:
        routing(m.MICRO * m.SEQ)
        balance(base, args.balance_steps)
    for ep in args.ep_sizes:
        layout(base, f"4 experts, ep_size {ep}", 4, ep, 1, 1.0, m.FFN, args.steps)
    for label, (e, ep, k, cf, ffn) in zip(("your layout", "your second layout"), args.layout or []):
        layout(base, label, int(e), int(ep), int(k), float(cf), int(ffn), args.steps)
    if args.yours:
        yours(args.yours, args.steps)
    if not args.layouts_only:
        zero_states(base)
        record("client_optimizer_error", client_optimizer_without_groups(base))
        checkpoint(base, args.steps)
    finish()


if __name__ == "__main__":
    main()
