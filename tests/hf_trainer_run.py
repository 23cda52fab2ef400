"""Run by tests/test_hf_trainer.py: Hugging Face ``Trainer`` with ``DistributedMuon(grad_reduce="ddp")`` and
``muongrid.hf.ShardedCheckpoint``, on a tiny ``LlamaForCausalLM`` built from a config (no download).

Under ``torchrun --nproc-per-node 2`` (gloo), one job runs, each with gradient accumulation 2, bf16 autocast and
Trainer's default ``max_grad_norm`` (1.0), Trainer's own scheduler and shuffled data:

* ``straight``: 4 steps, saving at steps 2 and 4 (``save_total_limit=1`` keeps the last);
* ``resumed``: a fresh model and optimizer, ``resume_from_checkpoint`` at the straight run's step 2 (kept aside
  before the limit removed it), to step 4: its parameters, and its last loss, must be the straight run's bit for
  bit;
* ``fp16``: 2 steps with ``fp16=True`` instead (Trainer's GradScaler drives the step: allowed in the DDP mode);
* ``bare``: 2 steps saved without the callback, then resumed without it: every rank must stop, naming
  ``ShardedCheckpoint``.

Without torchrun (one process): ``--reshard-from DIR`` resumes the 2-rank step-2 checkpoint on one rank (twice the
per-device batch, so the same global batch) through the resharded copy, and reports how far its step-4
parameters are from the 2-rank straight run's. Prints one JSON line (rank 0).

    torchrun --standalone --nproc-per-node 2 tests/hf_trainer_run.py --out /tmp/hf
    python tests/hf_trainer_run.py --out /tmp/hf --reshard-from /tmp/hf
"""
import argparse
import json
import os
import shutil
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

SEQ, VOCAB, ROWS = 16, 64, 32


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        gen = torch.Generator().manual_seed(7)
        self.ids = torch.randint(0, VOCAB, (ROWS, SEQ), generator=gen)

    def __len__(self):
        return ROWS

    def __getitem__(self, i):
        return dict(input_ids=self.ids[i], labels=self.ids[i])


def tiny_llama():
    import transformers
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)
    return transformers.LlamaForCausalLM(cfg)


def trainer_args(out, steps, batch, fp16=False, **kw):
    from transformers import TrainingArguments
    return TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=batch,
                             gradient_accumulation_steps=2, bf16=not fp16, fp16=fp16, learning_rate=3e-3,
                             weight_decay=0.0,
                             lr_scheduler_type="linear", warmup_steps=1, save_steps=2, save_total_limit=1,
                             logging_steps=1, report_to=[], seed=0, use_cpu=True, disable_tqdm=True,
                             dataloader_num_workers=0, ddp_backend="gloo" if "LOCAL_RANK" in os.environ else None,
                             **kw)


def run(out, steps=4, batch=2, callback=True, resume=None, keep_at=None, fp16=False):
    """One Trainer run; returns (the model's parameters after it, the losses it logged)."""
    from transformers import Trainer, TrainerCallback

    from muongrid import DistributedMuon, Grid, hybrid_param_groups
    from muongrid.hf import ShardedCheckpoint
    args = trainer_args(out, steps, batch, fp16)
    device = args.device   # sets up the process group (gloo) under torchrun: the README's recipe
    grid = Grid.build(dp=args.world_size, tp=1, device=device) if args.world_size > 1 else Grid.single()
    model = tiny_llama()
    opt = DistributedMuon(hybrid_param_groups(model, muon=dict(lr=0.02)), grid, grad_reduce="ddp")

    class Keep(TrainerCallback):   # a copy of checkpoint-<keep_at> before save_total_limit removes it
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == keep_at and (not dist.is_initialized() or dist.get_rank() == 0):
                shutil.copytree(Path(out) / f"checkpoint-{keep_at}", Path(out).parent / f"kept-{keep_at}")

    callbacks = ([ShardedCheckpoint(opt)] if callback else []) + ([Keep()] if keep_at else [])
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), optimizers=(opt, None), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return [p.detach().clone() for p in model.parameters()], losses


def same_on_every_rank(params) -> bool:
    if not dist.is_initialized():
        return True
    mine = torch.cat([p.reshape(-1) for p in params])
    theirs = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(theirs, mine)
    return all(torch.equal(mine, t) for t in theirs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--reshard-from", default=None, help="resume the 2-rank step-2 checkpoint in one process")
    a = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    out, result = Path(a.out), {}
    if a.reshard_from:
        src = Path(a.reshard_from)
        straight = torch.load(src / "straight.pt", weights_only=True)
        params, losses = run(out / "one", batch=4, resume=str(src / "kept-2"))
        result["max_abs_diff"] = max(float((x - y).abs().max()) for x, y in zip(params, straight["params"]))
        result["moved"] = max(float((x - y).abs().max()) for x, y in zip(straight["params"], straight["start"]))
        result["losses"], result["straight_losses"] = losses, straight["losses"]
        print(json.dumps(result), flush=True)
        return 0
    start = [p.detach().clone() for p in tiny_llama().parameters()]
    straight, straight_losses = run(out / "straight", keep_at=2)
    resumed, resumed_losses = run(out / "resumed", resume=str(out / "kept-2"))
    rank = dist.get_rank()
    result.update(world=dist.get_world_size(), equal_ranks=same_on_every_rank(straight),
                  resumed_equal=all(torch.equal(x, y) for x, y in zip(straight, resumed)),
                  moved=any(not torch.equal(x, y) for x, y in zip(straight, start)),
                  losses=straight_losses, resumed_losses=resumed_losses,
                  kept=sorted(os.listdir(out / "kept-2")), last=sorted(os.listdir(out / "straight")),
                  shards=sorted(os.listdir(out / "kept-2" / "muongrid-shards")))
    if rank == 0:
        torch.save(dict(params=straight, start=start, losses=straight_losses), out / "straight.pt")
    fp16, fp16_losses = run(out / "fp16", steps=2, callback=False, fp16=True)   # GradScaler drives the step
    result.update(fp16_equal_ranks=same_on_every_rank(fp16), fp16_losses=fp16_losses,
                  fp16_moved=any(not torch.equal(x, y) for x, y in zip(fp16, start)))
    run(out / "bare", steps=2, callback=False)
    try:
        run(out / "bare-resumed", steps=4, callback=False, resume=str(out / "bare" / "checkpoint-2"))
        result["bare"] = None
    except Exception as e:   # noqa: BLE001 (what Trainer's resume raised, whatever its type)
        result["bare"] = f"{type(e).__name__}: {e}"
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, result)
    if rank == 0:
        print(json.dumps(dict(ranks=everyone)), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
