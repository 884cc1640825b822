"""Each rank says who it is as DeepSpeed and as Slurm see it, then all ranks all_reduce rank + 1: what the cluster
lessons (notebooks 14 and 18) measure for every way of launching DeepSpeed under Slurm.

``deepspeed.init_distributed()`` reads RANK, WORLD_SIZE, MASTER_ADDR/PORT when a DeepSpeed launcher set them; started
by ``srun`` or ``mpirun`` directly (``--launcher slurm`` / ``openmpi``), it asks MPI (mpi4py) instead.
``--fail_rank N``: rank N raises while the others wait (as a rank stuck in a collective would); ``--sleep S``: every rank sleeps S seconds first (a job that
overruns its time limit).

Run under Slurm:  srun -N 2 bash -c 'deepspeed --hostfile hostfile --no_ssh --node_rank=$SLURM_NODEID \\
                      --master_addr <first node> scripts/14_slurm_ranks.py'
"""
import argparse
import os
import sys
import time

import deepspeed
import torch
import torch.distributed as dist

from course_utils.common.record import record
from course_utils.common.records.slurm import SlurmRank
from course_utils.rank.scaffolding import finish, parse_args


def _int(name: str) -> int | None:
    return int(os.environ[name]) if name in os.environ else None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fail_rank", type=int, default=None, help="this rank raises, the others wait")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds every rank waits before it starts")
    return parser


def main(argv=None) -> None:
    args = parse_args(build_parser(), argv)
    time.sleep(args.sleep)
    # Without a launcher's RANK/MASTER_ADDR, DeepSpeed discovers them with MPI and uses distributed_port (its default
    # is 29500, which two jobs on one node would share): the course hands each launch a free one.
    deepspeed.init_distributed(dist_backend="gloo", distributed_port=int(os.environ.get("COURSE_MASTER_PORT", 29500)))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if args.fail_rank is not None:       # the others wait outside any collective: only the launcher can end them
        if args.fail_rank == rank:
            raise RuntimeError(f"deliberate failure on rank {rank} (node {os.environ.get('SLURMD_NODENAME')})")
        while True:
            time.sleep(0.2)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    me = SlurmRank(rank=rank, local_rank=int(os.environ.get("LOCAL_RANK", 0)), node_rank=_int("CROSS_RANK"),
                   world_size=world_size, node=os.environ.get("SLURMD_NODENAME"), slurm_nodeid=_int("SLURM_NODEID"),
                   slurm_procid=_int("SLURM_PROCID"), master_addr=os.environ.get("MASTER_ADDR", ""),
                   master_port=int(os.environ.get("MASTER_PORT", 0)), all_reduce=total.item(), pid=os.getpid())
    print(f"rank {rank}/{world_size} local_rank {me.local_rank} node_rank {me.node_rank} on Slurm node {me.node} "
          f"(SLURM_NODEID {me.slurm_nodeid}): all_reduce(rank + 1) = {me.all_reduce:.0f}", flush=True)
    record(me)
    # DeepSpeed asked MPI: mpirun fails a job whose ranks end without MPI_Finalize. mpi4py calls it at a normal exit,
    # but finish() leaves through os._exit, which skips that: call it here.
    if "mpi4py.MPI" in sys.modules:
        sys.modules["mpi4py.MPI"].Finalize()
    finish()


if __name__ == "__main__":
    main()
