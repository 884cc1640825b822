"""A Hugging Face Trainer script with DeepSpeed that imports nothing from this course: copy it for your own work.

Every ``TrainingArguments`` field is a command-line flag (``HfArgumentParser``), and the DeepSpeed config's
``"auto"`` values are filled from them. From a terminal, on 2 GPUs:

    deepspeed --num_gpus 2 scripts/trainer_template.py --deepspeed configs/trainer_zero2_offload.json \\
        --output_dir build/template --max_steps 30 --per_device_train_batch_size 4 --learning_rate 5e-3 --warmup_steps 5

Replace ``tiny_model`` with ``AutoModelForCausalLM.from_pretrained(...)`` and ``CountingTokens`` with your tokenized
data set. On CPU-only ranks the script joins them itself (``join_cpu_ranks``); on GPUs that needs nothing.

It ends with ``dist.destroy_process_group()`` (``leave_cleanly``): a rank that leaves its process group to the
interpreter's teardown can abort in gloo after its work is done, and the launch fails with exit code 250.

On CPU ranks DeepSpeed also leaves one ~66 MB shared-memory buffer per rank in /dev/shm, ended or crashed alike:
``/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>`` (created by ``shm_initialize`` in
deepspeed/ops/csrc/cpu/comm/shm.cpp; its ``shared_close``, the only ``shm_unlink``, is never called). No setting turns
it off: it is made whenever DeepSpeed's accelerator is the CPU and every rank is on one node (``LOCAL_SIZE``, set by
the launcher). Remove a launch's buffers once it has ended, e.g. for the default address and port:

    rm -f /dev/shm/deepspeed_allreduce_buffer_$(id -u)_127.0.0.1_29500_*
"""
import os

import accelerate
import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments


class CountingTokens(torch.utils.data.Dataset):
    """Stand-in data with something to learn: ``n`` sequences of ``length`` token ids, each counting upward by one
    from a random start (modulo ``vocab_size``), each its own label (causal LM). Every next token follows from the one
    before, so the loss falls within a few dozen steps: a quick sign that the whole set-up trains."""

    def __init__(self, n: int, length: int, vocab_size: int, seed: int = 0):
        starts = torch.randint(0, vocab_size, (n, 1), generator=torch.Generator().manual_seed(seed))
        self.ids = (starts + torch.arange(length)) % vocab_size

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_model() -> GPT2LMHeadModel:
    """A small GPT-2 built from a config (no download); the same seed gives every rank the same weights."""
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=64, n_embd=64, n_layer=2, n_head=2,
                                      bos_token_id=0, eos_token_id=0))


def join_cpu_ranks(parser: HfArgumentParser) -> None:
    """Make the Trainer count every rank of a CPU-only launch, as it does on GPUs by itself.

    With no accelerator it knows, accelerate picks no backend and counts one process: every rank computes
    ``train_batch_size`` for itself alone and DeepSpeed, which sees all ranks, rejects it ("train_batch_size is not
    equal to ..."; notebook 08, section 8). So build accelerate's DeepSpeed state over gloo before
    ``TrainingArguments``, and have the Trainer use it (``use_configured_state``; an ``--accelerator_config`` of your
    own replaces this default, so keep ``"use_configured_state": true`` in it).
    """
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"          # what TrainingArguments(deepspeed=...) sets
    accelerate.PartialState(backend="gloo")
    parser.set_defaults(accelerator_config='{"use_configured_state": true}')


def leave_cleanly() -> None:
    """End the process group before the interpreter's teardown, which can abort in gloo (exit code 250)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def main() -> None:
    parser = HfArgumentParser(TrainingArguments)
    if not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        join_cpu_ranks(parser)
    (args,) = parser.parse_args_into_dataclasses()
    model = tiny_model()
    trainer = Trainer(model=model, args=args, train_dataset=CountingTokens(512, 32, model.config.vocab_size))
    result = trainer.train()
    engine = trainer.model_wrapped                    # the DeepSpeed engine the Trainer built
    if args.process_index == 0:
        print(f"trained {result.global_step} steps on {args.world_size} ranks; DeepSpeed's train_batch_size "
              f"{engine.train_batch_size()} = {engine.train_micro_batch_size_per_gpu()} per rank x "
              f"{engine.gradient_accumulation_steps()} accumulation x {engine.world_size} ranks; "
              f"training loss {result.training_loss:.3f}", flush=True)
    leave_cleanly()


if __name__ == "__main__":
    main()
