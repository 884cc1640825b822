"""Notebook 14's exercises, answered wrong on purpose (see tests/answers/__init__.py). Their checks judge real jobs on
the notebook's Slurm cluster: the replay runs before the cell that stops it (tagged ``conftest.REPLAY_TAG``),
while the cluster still runs, so the trials' jobs need no cluster of their own."""
from answers import wrong

ANSWERS = {
    "sbatch_script": wrong(
        copier=("copies the course's batch script, the fallback of the cell below: one rank per node", """
            def sbatch_script(deepspeed: str, script: str) -> str:
                return slurm_launch.batch_script(deepspeed, script)
            """),
        misread=("thinks --no_ssh makes DeepSpeed's hostfile unnecessary, since no node is reached over ssh: gives each "
                 "node's launcher its node rank and the master address, and no hostfile", r"""
            def sbatch_script(deepspeed: str, script: str) -> str:
                return f'''#!/bin/bash
            #SBATCH --job-name=my-deepspeed
            #SBATCH --nodes=2
            #SBATCH --ntasks-per-node=1
            #SBATCH --time=00:05:00
            set -euo pipefail
            first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
            master=$(scontrol show node "$first" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
            srun --kill-on-bad-exit=1 --output="$COURSE_RUN_DIR/node-%N-%n.out" bash -c \\
              "{deepspeed} --no_ssh --node_rank=\\$SLURM_NODEID --master_addr $master --master_port $COURSE_MASTER_PORT {script}"
            '''
            """),
        run="from_solution", launches=True, secret=("slots=2",)),
    "slurm_launcher_args": wrong(
        copier=("copies the --launcher_args of the failed command printed above", """
            def slurm_launcher_args() -> str:
                return "--ntasks-per-node=1 --job-name=course-fce240"
            """),
        misread=("takes Slurm's own PMI-2 for one every MPI speaks", """
            def slurm_launcher_args() -> str:
                return "--mpi=pmi2"
            """),
        run="from_solution", launches=True, secret=("--mpi=pmix",)),
}
