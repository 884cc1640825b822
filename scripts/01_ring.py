"""Ring all-reduce written from send/recv (the notebook's exercise), checked against dist.all_reduce,
with the bytes each rank sent counted, then run once more on a tensor whose values name their origin
to record, step by step, which chunk each rank sent and what every chunk held (the notebook's picture).

Run from a terminal:  deepspeed --num_gpus 2 scripts/01_ring.py --ring_file build/exercises/ring.py
"""
import argparse

import deepspeed
import torch
import torch.distributed as dist

from course_utils.rank.distributed import choose_device, rank_identity
from course_utils.rank.ring import count_sent_bytes, record_collectives, ring_bytes_expected, trace_ring
from course_utils.rank.ring_reference import course_ring_all_reduce
from course_utils.common.record import record
from course_utils.common.records.collectives import Ring, RingStep
from course_utils.rank.scaffolding import finish, load_exercise, parse_args


def ring_result(rank: int, world: int, tensor, reference, sent: dict, returned=None, collectives: dict | None = None) -> Ring:
    """The ``ring`` record of one rank: the tensor its ring was given (the exercise sums it in place), read after the
    call, against ``dist.all_reduce``'s result; a different tensor it returned, if any, against the same; the bytes
    counted and the collectives it called."""
    size = reference.numel() * reference.element_size()
    close = lambda t: bool(t.shape == reference.shape and torch.allclose(t, reference, rtol=1e-5, atol=1e-5))
    other = returned if isinstance(returned, torch.Tensor) and returned is not tensor else None
    return Ring(rank=rank, matches=close(tensor), max_abs_diff=float((tensor - reference).abs().max()),
                bytes_sent=sent["bytes"], messages=sent["messages"], tensor_bytes=size,
                expected_bytes=ring_bytes_expected(size, world), world_size=world,
                returned_matches=None if other is None else close(other), collectives=dict(collectives or {}))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ring_file", default=None, help="file defining ring_all_reduce(tensor) (checks.export_function); "
                        "without it the ranks run the course's ring")
    parser.add_argument("--elements", type=int, default=1 << 16, help="float32 elements in the tensor to reduce")
    parser.add_argument("--cpu", action="store_true", help="CPU tensors over gloo even on a GPU machine "
                        "(for nodes simulated on one machine, whose ranks would share GPUs)")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    ring_all_reduce = (load_exercise(args.ring_file, ["ring_all_reduce"])["ring_all_reduce"] if args.ring_file
                       else course_ring_all_reduce)

    identity = rank_identity()
    device, backend = choose_device(identity.local_rank, identity.local_size, cpu=args.cpu)
    deepspeed.init_distributed(dist_backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    generator = torch.Generator().manual_seed(rank)
    data = torch.randn(args.elements, generator=generator).to(device)
    reference = data.clone()
    dist.all_reduce(reference)

    mine = data.clone()
    with count_sent_bytes() as sent, record_collectives() as collectives:
        result = ring_all_reduce(mine)
    ring = ring_result(rank, world, mine, reference, sent, returned=result, collectives=collectives)
    print(f"rank {rank}: ring == all_reduce (the tensor passed in): {ring.matches}, max |diff| {ring.max_abs_diff:.2e}, "
          f"sent {ring.bytes_sent} bytes in {ring.messages} messages (2(N-1)/N·S = {ring.expected_bytes:.0f}), "
          f"collectives called: {ring.collectives or 'none'}")
    record(ring)
    record(RingStep.NAME, trace_ring(ring_all_reduce, device))
    finish()


if __name__ == "__main__":
    main()
