"""Notebook 17's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "shard": wrong(
        copier=("copies the common tutorial's sharding the page shows and runs: cut every key, then shift the piece's "
                "labels", """
            def shard(sample: dict, sp_rank: int, sp_size: int) -> dict:
                chunk = sample["input_ids"].shape[1] // sp_size
                piece = slice(chunk * sp_rank, chunk * (sp_rank + 1))
                labels = sample["labels"][:, piece]
                return {"input_ids": sample["input_ids"][:, piece], "position_ids": sample["position_ids"][:, piece],
                        "shift_labels": torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)}
            """),
        misread=("shifts the whole sample first, but the wrong way: each token scored against the token before it", """
            def shard(sample: dict, sp_rank: int, sp_size: int) -> dict:
                chunk = sample["input_ids"].shape[1] // sp_size
                piece = slice(chunk * sp_rank, chunk * (sp_rank + 1))
                shifted = torch.nn.functional.pad(sample["labels"][:, :-1], (1, 0), value=-100)
                return {"input_ids": sample["input_ids"][:, piece], "position_ids": sample["position_ids"][:, piece],
                        "shift_labels": shifted[:, piece]}
            """)),
    "sp_loss": wrong(
        copier=("copies the one-process loss: the mean over this rank's own labelled tokens", """
            def sp_loss(loss_sum, count, group):
                return loss_sum / count
            """),
        misread=("divides by the whole sequence's count, forgetting that DeepSpeed averages the ranks' gradients", """
            def sp_loss(loss_sum, count, group):
                import torch.distributed as dist
                total = count.detach().float().clone()
                dist.all_reduce(total, group=group)
                return loss_sum / total
            """),
        run="from_solution", launches=True),
    "predict_sp4_longest": wrong(
        copier=[("copies the step from SP 1 to SP 2 the page shows, and doubles SP 2's longest length for twice the ranks", """
            def predict_sp4_longest() -> int:
                return 2 * sp2.longest
            """),
                ("launched with that doubling, then copies the longest length SP 4 printed into the function and runs "
                 "the check without launching again", """
            def predict_sp4_longest() -> int:
                return sp4.longest


            predicted_longest = 2 * sp2.longest
            """, "has changed since the launch")],
        misread=[("thinks every part of a rank's memory is per token, so four ranks train four times SP 1's longest "
                  "length", """
            def predict_sp4_longest() -> int:
                return 4 * sp1.longest
            """),
                 ("fits the peaks as the solution would, then answers the length where the fit crosses the limit: a "
                  "length between two the launch tries, where nothing is measured", """
            def predict_sp4_longest() -> int:
                import numpy as np

                rows = [(L, o.sp, o.peak(L)) for o in (sp1, sp2) for L in o.trained]
                A = np.array([[1, L / p, L * L / p] for L, p, _ in rows])
                c, a, b = np.linalg.lstsq(A, np.array([peak for *_, peak in rows]), rcond=None)[0]
                roots = np.roots([b / 4, a / 4, c - CAP_MB * 2**20])
                return int(max(r.real for r in roots if abs(r.imag) < 1e-9))
            """)]),
    "trainer_parallelism": wrong(
        copier=("copies the page's ParallelismConfig(sp_backend='deepspeed', sp_size=2): every rank in the SP group", """
            def trainer_parallelism(num_attention_heads: int, num_key_value_heads: int, world_size: int) -> dict:
                return {"sp_backend": "deepspeed", "sp_size": world_size}
            """),
        misread=("applies only the query-head rule, as if key/value heads split like query heads", """
            def trainer_parallelism(num_attention_heads: int, num_key_value_heads: int, world_size: int) -> dict:
                sp = max(d for d in range(1, world_size + 1) if world_size % d == 0 and num_attention_heads % d == 0)
                return {"sp_backend": "deepspeed", "sp_size": sp, "dp_replicate_size": world_size // sp}
            """)),
}
