"""Notebook 00's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "roll_call": wrong(
        copier=("copies the hello line's own pid: each rank returns a list of itself only", """
            def roll_call() -> list[int]:
                import os
                return [os.getpid()]
            """),
        misread=("gathers every rank's number instead of its process id", """
            def roll_call() -> list[int]:
                ranks = [None] * dist.get_world_size()
                dist.all_gather_object(ranks, dist.get_rank())
                return ranks
            """),
        run="from_solution", launches=True),
    "prepare_then_read": wrong(
        copier=("copies the first try above it: the other ranks read before rank 0 has written", """
            def prepare_then_read(path: str, build_vocabulary) -> str:
                if dist.get_rank() == 0:
                    text = build_vocabulary()
                    with open(path, "w") as f:
                        f.write(text)
                with open(path) as f:
                    return f.read()
            """),
        misread=("lets every rank build and write the file, so no rank has to wait", """
            def prepare_then_read(path: str, build_vocabulary) -> str:
                text = build_vocabulary()
                with open(path, "w") as f:
                    f.write(text)
                with open(path) as f:
                    return f.read()
            """),
        launches=True),
}
