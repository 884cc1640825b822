"""A Hugging Face Trainer script with DeepSpeed that imports nothing from this course: copy it for your own work.

Every ``TrainingArguments`` field is a command-line flag (``HfArgumentParser``), and the DeepSpeed config's
``"auto"`` values are filled from them. From a terminal, on 2 GPUs:

    deepspeed --num_gpus 2 scripts/trainer_template.py --deepspeed configs/trainer_zero2_offload.json \\
        --output_dir build/template --max_steps 8 --per_device_train_batch_size 4

Replace ``tiny_model`` with ``AutoModelForCausalLM.from_pretrained(...)`` and ``RandomTokens`` with your tokenized
data set. On CPU-only ranks the Trainer does not join the launch's process group by itself (notebook 08, section 1):
under the course's runner its rank hook prepares that for you; elsewhere call, before ``TrainingArguments``,
``os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"; accelerate.PartialState(backend="gloo")`` and pass
``--accelerator_config '{"use_configured_state": true}'``.
"""
import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments


class RandomTokens(torch.utils.data.Dataset):
    """Stand-in data: ``n`` sequences of ``length`` random token ids, each its own label (causal LM)."""

    def __init__(self, n: int, length: int, vocab_size: int, seed: int = 0):
        self.ids = torch.randint(0, vocab_size, (n, length), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_model() -> GPT2LMHeadModel:
    """A small GPT-2 built from a config (no download); the same seed gives every rank the same weights."""
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=2,
                                      bos_token_id=0, eos_token_id=0))


def main() -> None:
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
    model = tiny_model()
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(512, 32, model.config.vocab_size))
    result = trainer.train()
    engine = trainer.model_wrapped                    # the DeepSpeed engine the Trainer built
    if args.process_index == 0:
        print(f"trained {result.global_step} steps on {args.world_size} ranks; DeepSpeed's train_batch_size "
              f"{engine.train_batch_size()} = {engine.train_micro_batch_size_per_gpu()} per rank x "
              f"{engine.gradient_accumulation_steps()} accumulation x {engine.world_size} ranks; "
              f"training loss {result.training_loss:.3f}", flush=True)


if __name__ == "__main__":
    main()
