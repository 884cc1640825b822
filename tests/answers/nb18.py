"""Notebook 18's exercises, answered wrong on purpose (see tests/answers/__init__.py). The replay runs before the
time-limit drill's cell (tagged ``conftest.REPLAY_TAG``), while the cluster still runs: exercise 1's check submits a
one-node job (no DeepSpeed launch) with each answer's options; exercise 2's reads the preempted job's records."""
from answers import wrong

ANSWERS = {
    "past_the_drain": wrong(
        copier=("copies the options of the drained-node drill above", """
            def past_the_drain() -> list[str]:
                return ["--nodelist=n2"]
            """),
        misread=("thinks --nodelist lists the nodes Slurm may choose from, as --nodes=1 picks one of them", """
            def past_the_drain() -> list[str]:
                return ["--nodes=1", "--nodelist=n1,n2"]
            """),
        secret=("--exclude",)),
    "requeued_run": wrong(
        copier=[("copies the first run's last step and loss from the table", """
            def requeued_run(first: list[PreemptRun]) -> tuple[int, float]:
                return first[0].steps[-1], first[0].losses[-1]
            """),
                ("reads the second run's first step and loss, which the kernel already holds", """
            def requeued_run(first: list[PreemptRun]) -> tuple[int, float]:
                return again[0].steps[0], again[0].losses[0]
            """, "looked up `again`")],
        misread=("thinks a requeued job trains again from its first step, since Slurm runs the batch script again from "
                 "its first line", """
            def requeued_run(first: list[PreemptRun]) -> tuple[int, float]:
                return 1, first[0].losses[0]
            """)),
}
