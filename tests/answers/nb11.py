"""Notebook 11's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

ANSWERS = {
    "accumulate": wrong(
        copier=("copies DeepSpeed's plain loop, the one the launch cell quotes from the script and section 1 writes out", """
            def accumulate(engine, micro_batches: list) -> list:
                losses = []
                for batch in micro_batches:
                    loss = engine(**batch).loss
                    engine.backward(loss)
                    engine.step()
                    losses.append(loss.item())
                return losses
            """),
        misread=("weighs each micro-batch by its share of the tokens and switches the engine's division off, but "
                 "thinks the engine sums the ranks' gradients and so divides every loss by the number of ranks too: "
                 "every setting's update is half the right one, alike", """
            def accumulate(engine, micro_batches: list) -> list:
                tokens = [int((batch["labels"] != -100).sum()) for batch in micro_batches]
                losses = []
                for batch, n in zip(micro_batches, tokens):
                    loss = engine(**batch).loss
                    engine.backward(loss * n / sum(tokens) / dist.get_world_size(), scale_wrt_gas=False)
                    engine.step()
                    losses.append(loss.item())
                return losses
            """),
        run="from_solution", launches=True),
    "predict_activations": wrong(
        copier=[("copies the table's row nearest to 96 × 3 tokens", """
            def predict_activations(seq_len: int, batch: int) -> dict:
                rows = act.to_dict("records")
                nearest = min(rows, key=lambda r: abs(r["tokens"] - seq_len * batch))["tokens"]
                return {how: next(r["activations after forward (MiB)"] for r in rows
                                  if r["checkpointing"] == how and r["tokens"] == nearest) * 2 ** 20 for how in ("off", "hf")}
            """),
                ("copies the check cell's own call, which reads the launch's measurement of 96 × 3 instead of predicting it",
                 """
            def predict_activations(seq_len: int, batch: int) -> dict:
                return {how: perf.measured_activation(activations.records, how, seq_len, batch) for how in ("off", "hf")}
            """)],
        misread=("thinks activations grow with the square of the sequence length (attention's scores), from the largest row", """
            def predict_activations(seq_len: int, batch: int) -> dict:
                rows = act.to_dict("records")
                predicted = {}
                for how in ("off", "hf"):
                    r = max((r for r in rows if r["checkpointing"] == how), key=lambda r: r["tokens"])
                    predicted[how] = (r["activations after forward (MiB)"] * 2 ** 20
                                      * (seq_len / r["seq_len"]) ** 2 * batch / r["batch"])
                return predicted
            """)),
    "log_metrics": wrong(
        copier=("copies log_metrics as the page shows it and takes the guard out, so every rank reaches the all_reduce", """
            def log_metrics(step: int, loss):
                dist.all_reduce(loss)
                loss /= dist.get_world_size()
                return loss.item()
            """),
        misread=("lets every rank take part and counts the losses it keeps, but keeps out inf only: a nan (or -inf) "
                 "passes its guard", """
            def log_metrics(step: int, loss):
                kept = loss != float("inf")
                totals = torch.stack([torch.where(kept, loss, torch.zeros_like(loss)), kept.to(loss.dtype)])
                dist.all_reduce(totals)
                return (totals[0] / totals[1]).item() if totals[1] > 0 else float("nan")
            """),
        launches=True),
}
