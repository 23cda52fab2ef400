"""Run by tests/test_readme_loop.py under ``torchrun --nproc-per-node 4``: the README's training loop, as written,
on a tiny ``LlamaForCausalLM`` (from a config) and gloo.

The block under "Use it in your training loop" is read from README.md and run twice in one job, with only its
first line changed as the README says (``"gloo"``, the grid, 4 steps, a save every 3):

1. on 2 x 2 (TP 2) from scratch: 4 steps, saving at step 3;
2. on 4 x 1, from that save (the block finds ``ckpt`` and resumes): step 4 again.

A second ``init_process_group`` in one process is not allowed, so the second run skips it (the group stands).
Each run's step-4 loss is averaged over the ranks (every DP rank's mean over its rows; TP ranks share theirs), so
both are the global batch's mean loss. Prints one JSON line (rank 0).

    torchrun --standalone --nproc-per-node 4 tests/readme_loop_run.py --out /tmp/readme
"""
import argparse
import json
import os
import re
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]


def readme_loop() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Use it in your training loop"):]
    return re.search(r"```python\n(.*?)```", section, re.S)[1]


def tiny_llama():
    import transformers
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    return transformers.LlamaForCausalLM(cfg)


def run_block(code: str, dp: int, tp: int) -> float:
    first = 'backend, dp, tp, steps, every = "nccl", 2, 4, 10_000, 1000'
    assert first in code, "the README's loop no longer starts with the line this test adapts"
    code = code.replace(first, f'backend, dp, tp, steps, every = "gloo", {dp}, {tp}, 4, 3')
    code = code.replace("dist.init_process_group(", "dist.is_initialized() or dist.init_process_group(")
    rows = torch.randint(0, 64, (2048, 16), generator=torch.Generator().manual_seed(1))
    scope = dict(model=tiny_llama(), dataset=rows, __name__="readme")
    exec(compile(code, "README.md", "exec"), scope)
    loss = scope["loss"].detach().reshape(1).clone()
    dist.all_reduce(loss)
    return float(loss) / dist.get_world_size(), scope["start"]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    a = p.parse_args()
    os.chdir(a.out)   # the block saves to ./ckpt
    torch.set_num_threads(1)
    code = readme_loop()
    straight, start_a = run_block(code, 2, 2)
    resumed, start_b = run_block(code, 4, 1)
    if dist.get_rank() == 0:
        print(json.dumps(dict(straight=straight, resumed=resumed, starts=[start_a, start_b],
                              saved=sorted(os.listdir("ckpt")))), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
