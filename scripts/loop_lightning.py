"""Muon under the Lightning Trainer (chapter 12): DistributedMuon's DDP mode.

    torchrun --standalone --nproc-per-node 2 scripts/loop_lightning.py --dp 2 \\
        --lr 0.01 --steps 40 --save _build/loop_lightning --every 20
    torchrun --standalone --nproc-per-node 2 scripts/loop_lightning.py --dp 2 \\
        --lr 0.01 --steps 40 --resume _build/loop_lightning/step=20.ckpt
    python scripts/loop_lightning.py --dp 2 --lr 0.01 --steps 4   # local gloo ranks

The lines Lightning needs are marked ``# Lightning``. The Trainer wraps the model in
DistributedDataParallel, which averages the gradients in backward, so
``configure_optimizers`` builds the optimizer with ``grad_reduce="ddp"``;
``accumulate_grad_batches`` skips DDP's all-reduce on micro-batches before the last
and ``gradient_clip_val`` clips the averaged gradient, the same on every rank. The
strategy, ``muongrid.lightning.ShardedDDPStrategy``, is Lightning's DDP with one
change: each checkpoint also has every rank's optimizer shard beside it, and
``fit(..., ckpt_path=...)`` loads each rank's own. The data is
``muongrid.data.ResumableLoader`` (each DP rank its rows), which Lightning saves and
restores itself (it has ``state_dict``); given a length, Lightning fetches no batch
ahead, so the position it saves is the next batch to train on. A resume on the same
number of ranks then ends where the run would have (a plain ``DataLoader`` cannot
resume mid-epoch: Lightning warns and starts it over). The model and the schedule
are ``loop_zero1_tp.py``'s.
"""
import sys

import lightning as L

from loop_zero1_tp import CONTEXT, loss_on, parse, schedule, tiny_gpt
from muongrid import DistributedMuon, hybrid_param_groups
from muongrid.data import ResumableLoader, TokenWindows
from muongrid.lab.charlm import load_corpus
from muongrid.launch import PrintsLog, launch
from muongrid.lightning import ShardedDDPStrategy


class Batches(ResumableLoader):
    def __len__(self):          # one pass over the data: no batch fetched ahead
        return self.sampler.per_epoch


class TinyLM(L.LightningModule):                                   # Lightning
    def __init__(self, data, grid, args):
        super().__init__()
        self.model, self.grid, self.args = tiny_gpt(data, grid.device), grid, args
        self.losses = []

    def on_train_start(self):
        self.first_step = self.global_step + 1

    def training_step(self, batch, index):
        loss = loss_on(self.model, *batch, self.args)
        self.losses.append(self.all_gather(loss.detach()).mean().item())
        return loss

    def configure_optimizers(self):
        lr = dict(lr=self.args.lr)                  # one lr for both groups
        groups = hybrid_param_groups(self.model, muon=lr, adamw=lr)
        opt = DistributedMuon(groups, self.grid, grad_reduce="ddp")   # DDP averages
        every_step = dict(scheduler=schedule(opt, self.args), interval="step")
        return dict(optimizer=opt, lr_scheduler=every_step)


def train(grid, args):
    """``Trainer.fit``; returns the trained model and every micro-batch's loss."""
    data = load_corpus()
    module = TinyLM(data, grid, args)
    rows = args.batch // (grid.dp * args.accum)     # a micro-batch of one rank
    loader = Batches(TokenWindows(data["train"], CONTEXT), rows * grid.dp,
                     dp=grid.dp, dp_rank=grid.dp_rank)
    saves = [L.pytorch.callbacks.ModelCheckpoint(
        args.save, "{step}", save_top_k=-1, every_n_train_steps=args.every)]
    trainer = L.Trainer(                                           # Lightning
        accelerator=grid.device.type, devices=grid.dp,
        strategy=ShardedDDPStrategy(), max_steps=args.steps,
        accumulate_grad_batches=args.accum, gradient_clip_val=1.0,
        use_distributed_sampler=False, callbacks=saves if args.save else [],
        enable_checkpointing=bool(args.save), logger=False,
        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, loader, ckpt_path=args.resume)             # Lightning
    return module.model, dict(first_step=module.first_step, losses=module.losses)


if __name__ == "__main__":
    sys.exit(launch(PrintsLog(train), parse(__doc__)))
