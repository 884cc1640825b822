"""Notebook 02's exercises, answered wrong on purpose (see tests/answers/__init__.py)."""
from answers import wrong

# Exercises 3 and 4 are checked on one launch (section 3's training run): the copier's two answers go to one launch,
# the misreader's two to another, and each check must refuse its own exercise.
TOGETHER = [("gather_predictions", "train_step")]

ANSWERS = {
    "fixed_config": wrong(
        copier=("copies the three numbers DeepSpeed's error multiplied (32 * 4 * 2) into train_batch_size", """
            def fixed_config(broken: dict) -> dict:
                config = json.loads(json.dumps(broken))
                config["train_batch_size"] = 32 * 4 * 2
                return config
            """),
        misread=("thinks train_batch_size counts one rank's examples per optimizer step: micro batch × accumulation", """
            def fixed_config(broken: dict) -> dict:
                config = json.loads(json.dumps(broken))
                config["train_batch_size"] = config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"]
                return config
            """)),
    "shard_loader": wrong(
        copier=[("copies the tutorial's loader from section 3: a plain shuffled DataLoader on every rank", """
            def shard_loader(dataset, batch_size, rank, world_size, shuffle=False, seed=0):
                from torch.utils.data import DataLoader
                return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle)
            """),
                ("copies the example of help(DistributedSampler), which asks the process group for the ranks", """
            def shard_loader(dataset, batch_size, rank, world_size, shuffle=False, seed=0):
                from torch.utils.data import DataLoader, DistributedSampler
                sampler = DistributedSampler(dataset)
                return DataLoader(dataset, batch_size=batch_size, shuffle=(sampler is None), sampler=sampler)
            """)],
        misread=[("gives each rank a seed of its own, thinking ranks should shuffle differently to see different data", """
            def shard_loader(dataset, batch_size, rank, world_size, shuffle=False, seed=0):
                from torch.utils.data import DataLoader, DistributedSampler
                sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed + rank)
                return DataLoader(dataset, batch_size=batch_size, sampler=sampler)
            """),
                 ("thinks the sampler decides the batches too, and gives the DataLoader no batch size", """
            def shard_loader(dataset, batch_size, rank, world_size, shuffle=False, seed=0):
                from torch.utils.data import DataLoader, DistributedSampler
                return DataLoader(dataset, sampler=DistributedSampler(dataset, num_replicas=world_size, rank=rank,
                                                                      shuffle=shuffle, seed=seed))
            """, "not batches of batch_size")],
        secret=("[[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 0]]",)),
    "gather_predictions": wrong(
        copier=("copies the tutorial's output_reduce that section 3 describes: all_gather and concatenate, nothing removed", """
            def gather_predictions(indices, preds, labels):
                local = torch.stack([indices, preds, labels])
                gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
                dist.all_gather(gathered, local)
                every = torch.cat(gathered, dim=1)
                return every[0], every[1], every[2]
            """),
        misread=("removes the repeated indices after gathering, and keeps every gathered prediction and label", """
            def gather_predictions(indices, preds, labels):
                local = torch.stack([indices, preds, labels])
                gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
                dist.all_gather(gathered, local)
                every = torch.cat(gathered, dim=1)
                return torch.unique(every[0]), every[1], every[2]
            """, "remove the repeats from all three alike"),
        run="from_solution", launches=True),
    "train_step": wrong(
        copier=("copies the three engine calls section 2 prints and returns the loss its forward gave", """
            def train_step(engine, batch, device) -> float:
                out = engine(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                             labels=batch["label"].to(device))
                engine.backward(out.loss)
                engine.step()
                return out.loss.item()
            """),
        misread=[("averages the loss over the ranks first, all_reduce on the loss itself, then backward on the mean", """
            def train_step(engine, batch, device) -> float:
                out = engine(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                             labels=batch["label"].to(device))
                dist.all_reduce(out.loss)
                loss = out.loss / dist.get_world_size()
                engine.backward(loss)
                engine.step()
                return loss.item()
            """, "the loss handed to engine.backward")],
        run="from_solution", launches=True),
}
