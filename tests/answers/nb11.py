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
        misread=("weighs each micro-batch by its share of the tokens, as a plain PyTorch loop must, not knowing that "
                 "engine.backward divides by the accumulation steps once more", """
            def accumulate(engine, micro_batches: list) -> list:
                tokens = [(batch["labels"] != -100).sum() for batch in micro_batches]
                losses = []
                for batch, n in zip(micro_batches, tokens):
                    loss = engine(**batch).loss
                    engine.backward(loss * n / sum(tokens))
                    engine.step()
                    losses.append(loss.item())
                return losses
            """),
        run="from_solution", launches=True),
    "predict_activations": wrong(
        copier=("copies the table's row nearest to 96 × 3 tokens", """
            def predict_activations(seq_len: int, batch: int) -> dict:
                rows = act.to_dict("records")
                nearest = min(rows, key=lambda r: abs(r["tokens"] - seq_len * batch))["tokens"]
                return {how: next(r["activations after forward (MiB)"] for r in rows
                                  if r["checkpointing"] == how and r["tokens"] == nearest) * 2 ** 20 for how in ("off", "hf")}
            """),
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
        misread=("lets every rank take part, sending 0 for a loss that is not finite, and divides by the number of ranks", """
            def log_metrics(step: int, loss):
                sent = torch.where(torch.isfinite(loss), loss, torch.zeros_like(loss))
                dist.all_reduce(sent)
                return (sent / dist.get_world_size()).item()
            """),
        launches=True),
}
