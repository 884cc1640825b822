"""Notebook 01's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "predict": wrong(
        copier=[("copies the starting list the text gives for each rank, as if no collective had run", """
            def predict(collective: str, rank: int, world_size: int) -> list:
                return [10 * rank + i for i in range(1, world_size + 1)]
            """),
                ("looks the answer up in the tables the launches measured, built in the cell before the exercise", """
            def predict(collective: str, rank: int, world_size: int) -> list:
                t = two if world_size == 2 else four
                return list(t.loc[(collective, rank), "after"])
            """, "which holds what the launches measured")],
        misread=[("thinks reduce_scatter leaves the whole sum on every rank, like all_reduce", """
            def predict(collective: str, rank: int, world_size: int) -> list:
                start = lambda r: [10 * r + i for i in range(1, world_size + 1)]
                summed = [sum(col) for col in zip(*(start(r) for r in range(world_size)))]
                return {"broadcast": start(0), "all_reduce": summed, "reduce_scatter": summed,
                        "all_gather": [10 * r + 1 for r in range(world_size)]}[collective]
            """),
                 ("returns reduce_scatter's element as a bare number, not as the list of one the rank holds", """
            def predict(collective: str, rank: int, world_size: int) -> list:
                start = lambda r: [10 * r + i for i in range(1, world_size + 1)]
                summed = [sum(col) for col in zip(*(start(r) for r in range(world_size)))]
                return {"broadcast": start(0), "all_reduce": summed, "reduce_scatter": summed[rank],
                        "all_gather": [10 * r + 1 for r in range(world_size)]}[collective]
            """, "not a list")]),
    "ring_all_reduce": wrong(
        copier=[("copies the page's one index, 'rank r starts by sending its own chunk r', into every step of both "
                 "phases", """
            def ring_all_reduce(tensor):
                rank, world = dist.get_rank(), dist.get_world_size()
                chunks = list(tensor.chunk(world))
                right, left = (rank + 1) % world, (rank - 1) % world
                buffer = torch.empty_like(chunks[0])
                for phase in ("scatter-reduce", "all-gather"):
                    for step in range(world - 1):
                        request = dist.isend(chunks[rank].contiguous(), right)
                        dist.recv(buffer, left)
                        request.wait()
                        if phase == "scatter-reduce":
                            chunks[(rank - 1) % world] += buffer
                        else:
                            chunks[(rank - 1) % world].copy_(buffer)
                return tensor
            """),
                ("calls the collective the section compares the ring with, then sends and receives 2(N−1) chunk-sized "
                 "dummies so the byte count the page gives comes out (dist.all_reduce alone meets the same refusal)", """
            def ring_all_reduce(tensor):
                dist.all_reduce(tensor)
                rank, world = dist.get_rank(), dist.get_world_size()
                dummy = torch.zeros_like(tensor.chunk(world)[0])
                buffer = torch.empty_like(dummy)
                for step in range(2 * (world - 1)):
                    request = dist.isend(dummy, (rank + 1) % world)
                    dist.recv(buffer, (rank - 1) % world)
                    request.wait()
                return tensor
            """, "a ring uses only point-to-point sends and receives")],
        misread=[("runs a correct ring on a copy of the tensor and returns the copy, where the task sums `tensor` "
                  "in place", """
            def ring_all_reduce(tensor):
                tensor = tensor.clone()
                rank, world = dist.get_rank(), dist.get_world_size()
                chunks = list(tensor.chunk(world))
                right, left = (rank + 1) % world, (rank - 1) % world
                buffer = torch.empty_like(chunks[0])
                for phase in range(2):
                    for step in range(world - 1):
                        send_i, recv_i = (rank - step + phase) % world, (rank - step - 1 + phase) % world
                        request = dist.isend(chunks[send_i].contiguous(), right)
                        dist.recv(buffer, left)
                        request.wait()
                        if phase == 0:
                            chunks[recv_i] += buffer
                        else:
                            chunks[recv_i].copy_(buffer)
                return tensor
            """, "the exercise sums `tensor` in place"),
                 ("adds in the all-gather phase too, where the finished chunks should be copied", """
            def ring_all_reduce(tensor):
                rank, world = dist.get_rank(), dist.get_world_size()
                chunks = list(tensor.chunk(world))
                right, left = (rank + 1) % world, (rank - 1) % world
                buffer = torch.empty_like(chunks[0])
                for phase in range(2):
                    for step in range(world - 1):
                        send_i, recv_i = (rank - step + phase) % world, (rank - step - 1 + phase) % world
                        request = dist.isend(chunks[send_i].contiguous(), right)
                        dist.recv(buffer, left)
                        request.wait()
                        chunks[recv_i] += buffer
                return tensor
            """)],
        run="from_solution", launches=True),
}
