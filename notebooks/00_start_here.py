# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,mystnb,jupyter,-all
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 0. Start here
#
# ```{admonition} What this chapter runs
# One 4-process run of [`scripts/verify.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/verify.py) (a 2 x 2 grid over gloo). About 20 seconds on a
# 2-core laptop.
# Reading: about 15 minutes at 200 words, 8 lines of code or one figure a minute, plus running it. Read first: nothing but PyTorch.
# ```

# %% tags=["hide-cell"] jupyter={"source_hidden": true}
# Set-up (written by `python -m muongrid.lab.notebook sync`).
# In Colab: fetch the book's code and install what this chapter needs beyond Colab's
# image (never torch). Elsewhere nothing is installed here: `make setup` does it.
import importlib.util, os, subprocess, sys  # noqa: E401
REPOSITORY = "https://github.com/muongrid-book/distributed-muon"
HOME = "/content/distributed-muon"  # where Colab keeps the clone
if "google.colab" in sys.modules:
    if not os.path.isdir(HOME) and subprocess.run(
            ["git", "clone", "--quiet", "--depth", "1", REPOSITORY, HOME]).returncode:
        raise RuntimeError(
            f"could not clone {REPOSITORY}: this book's repository is not public "
            "yet (or this runtime cannot reach it). Run the book on your machine: "
            "in a copy of the repository, `make lab` sets up Python and opens the "
            "chapters in JupyterLab (`make book` builds all of them).")
    os.chdir(os.path.join(HOME, "notebooks"))
    install = [sys.executable, "-m", "pip", "install", "-q"]
    if importlib.util.find_spec("muongrid") is None:  # the book's package, not its deps
        subprocess.run([*install, "--no-deps", ".."], check=True)
    wanted = [('yaml', 'PyYAML')]
    missing = [pip for module, pip in wanted
               if importlib.util.find_spec(module) is None]
    if missing:
        subprocess.run([*install, *missing], check=True)
    importlib.invalidate_caches()
elif (importlib.util.find_spec("muongrid") is None
      or not os.path.isfile(os.path.join("..", "scripts", "verify.py"))):
    raise RuntimeError(
        "this chapter runs inside the book's repository, with its package installed: "
        "in a copy of the repository, `make lab` sets it up and opens JupyterLab on "
        "its notebooks/ folder; open the chapter there. In Colab, open it with the "
        "book's Colab button.")

# %% [markdown]
# This book teaches **distributed Muon**: how the Muon optimizer, which needs each weight matrix
# *whole*, runs when the matrices and the optimizer state are *cut into pieces* across many
# processes. It follows the design of Moonshot AI's "Muon is Scalable for LLM Training"
# {cite:p}`liu2025muonscalable` (ZeRO-1 data parallel x tensor parallel) and checks every claim it
# makes with code that you can run.
#
# Moonshot released its distributed Muon code with the paper {cite:p}`moonshot2025moonlight`; a
# community tutorial {cite:p}`wei2025muondistributed` ran it on a CPU and found two bugs in it.
# This book calls that code **the proof of concept**. Its design (a flat ZeRO-1 buffer, whole
# buckets gathered for Newton-Schulz) is what chapters 3-7 build and measure; chapter 8 goes
# beyond it.
#
# **Learning goals.** After this chapter you can
#
# - say what the book covers and in which order;
# - run the book three ways: read it online, open a chapter in Colab, or run it on your machine;
# - launch the real distributed implementation from a notebook and read its verdict;
# - run the same script on a GPU cluster with `torchrun`.
#
# ## How this book is built
#
# Each chapter is a notebook that *explains* and *launches*; the algorithm lives in the small
# package `muongrid` in [`scripts/`](https://github.com/muongrid-book/distributed-muon/tree/main/scripts) and the command-line scripts beside it. A
# chapter that needs several processes runs a script such as [`scripts/verify.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/verify.py) as a subprocess
# (processes spawned from a notebook kernel cannot import functions defined in its cells). The helper `muongrid.lab.notebook.run` streams the script's output
# into the cell and **raises if the script fails**, so a broken script can never leave a green
# page behind.
#
# The book is built by executing every chapter from top to bottom: every number, table and
# figure you see came from that run, on the machine that built the book. A figure from
# elsewhere (a paper, a report) is cited.

# %% [markdown]
# ## The machine this page was built on
#
# Every chapter that measures something says where it ran. These pages ran here:

# %%
import os
import platform

import torch

from muongrid.newton_schulz import native_bf16_matmul

print(
    f"Python {platform.python_version()}, torch {torch.__version__}, {os.cpu_count()} "
    f"CPU cores"
)
print(f"CUDA available: {torch.cuda.is_available()}")
print(
    "bf16 matmul on this CPU:",
    (
        "native (fast)"
        if native_bf16_matmul(torch.device("cpu"))
        else "no fast path (AVX2 only): Newton-Schulz emulates bf16 products in fp32, "
             "see muongrid/newton_schulz.py"
    ),
)

# %% [markdown]
# ## A first distributed run
#
# [`scripts/verify.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/verify.py) runs Distributed Muon on a grid of processes: here 2 data-parallel
# replicas x 2 tensor-parallel shards, i.e. 4 processes talking over gloo, the CPU backend.
# Each rank gets different gradients (as if it saw a different slice of the batch). Rank 0 also
# runs ordinary single-process Muon on the whole matrices with the *averaged* gradients, and after
# every step each rank compares its own piece of every matrix with the reference. The five matrix
# shapes are the proof of concept's.

# %%
from muongrid.lab.notebook import last_json, run

result = last_json(run("verify.py --dp 2 --tp 2 --steps 3"))

# %% [markdown]
# The script ends with a JSON record; its verdict:

# %%
from muongrid.lab.page import keep, listing, say, show

ledger = result["ledger"]
print(
    f"grid: {result['dp']} x {result['tp']} = {result['world_size']} processes, "
    f"backend {result['backend']}"
)
print(
    f"largest |distributed - single process| over {result['steps']} steps: "
    f"{result['max_abs_diff']}"
)
print(
    f"verdict: "
    f"{'identical, bit for bit' if result['max_abs_diff'] == 0 else 'DIFFERENT'}"
)
calls = {name: p["calls"] for name, p in ledger["phases"].items()}
print(
    f"bytes each rank sent per step: {ledger['bytes_sent']:,} in {sum(calls.values())} "
    f"collectives: "
    + ", ".join(f"{n} {name}" for name, n in calls.items())
)
# One reduce-scatter, one DP gather and one parameter all-gather per bucket
# (the text below says so).
per_bucket = {
    calls[k] for k in ("grad_reduce_scatter", "ns_gather_dp", "param_all_gather")
}

# %% jupyter={"source_hidden": true} tags=["remove-cell"]
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert len(per_bucket) == 1
keep("ch0-collectives", sum(calls.values()))
keep("ch0-buckets", per_bucket.pop())
keep("ch0-tp-gathers", calls["ns_gather_tp"])

# %% [markdown]
# Exactly zero is the right standard: every rank runs the single process's arithmetic on a slice
# of the same numbers. Chapter 5 explains why, and what happens when it does not hold.

# %% jupyter={"source_hidden": true} tags=["remove-input"]
say(r"""
The {{ch0-collectives}} collectives are, per bucket of parameters, one gradient
reduce-scatter, one gather of the momentum for Newton-Schulz and one parameter all-gather
(`verify.py` puts the matrices into two parameter groups, so there are
{{ch0-buckets}} buckets), plus {{ch0-tp-gathers}} gathers over TP, one per
matrix split over TP. Chapter 5 goes through each stage.
""")

# %% [markdown]
# ## Three ways to run this book
#
# **Read it.** The built pages show every output. Each chapter's launch button (the rocket
# icon) opens it in Colab.
#
# **Colab.** Open a chapter with the Colab button and choose *Runtime > Run all*. The folded
# set-up cell under the title clones the repository into `/content` and installs what the
# chapter needs beyond Colab's own packages (never torch). Colab's two CPU cores match the
# machine these pages were built on.

# %% jupyter={"source_hidden": true} tags=["remove-input"]
from muongrid.lab.notebook import repository_is_public, repository_url

url = repository_url()
folder = url.rstrip("/").rsplit("/", 1)[-1]
if not repository_is_public():
    say(f"""
```{{admonition}} Not public yet
:class: warning
This book's repository, `{url}`, is not public yet, so in Colab the first cell stops with
a message that says so. Until it is, run the chapters on your machine, as below.
```
""")

# %% [markdown]
# **Your machine.** With Python 3.10 or newer, `git` and `make`, one command sets up the
# environment and opens the chapters in JupyterLab:

# %% jupyter={"source_hidden": true} tags=["remove-input"]
say(f"""```bash
git clone {url}
cd {folder}
make lab     # .venv with torch (CPU), muongrid, JupyterLab; opens notebooks/
```""")

# %% [markdown]
# `make test` runs the tests, `make book` builds these pages into `_build/html`, and `make help`
# lists the rest.
#
# **A GPU cluster.** Every script the chapters launch also runs under `torchrun`, which starts
# one process per GPU and lets the script use NCCL:
#
# ```bash
# torchrun --standalone --nproc-per-node 4 scripts/verify.py --dp 2 --tp 2
# torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \
#     --rdzv-endpoint node0:29500 scripts/verify.py --dp 2 --tp 8
# ```
#
# The appendix {doc}`../book/troubleshooting` has the details and a table of error messages.
#
# The project's one-GPU record, kept with its provenance in `book/data/` (nothing on this page
# ran on a GPU):

# %%
from IPython.display import Markdown

from muongrid.lab import gpurecord

record = gpurecord.load()
ns = record["ns_speed"]
passed = sum(s["rc"] == 0 for s in record["steps"])
ns5, matmul = ns["best_ns5_gflops"], ns["best_matmul_gflops"]
pairs = ns["pair_ratios"]  # NS5's rate over the matmul's, run by run
Markdown(gpurecord.provenance_text(record).replace("\n  ", "  \n") + "\n\n"
         f"{passed} of the record's {len(record['steps'])} commands exited 0. "
         f"Newton-Schulz on a 4096 x 4096 matrix ran at {ns5 / 1e3:.0f} TFLOP/s, "
         f"{ns5 / matmul:.0%} of a same-size bf16 matmul: each rate is the fastest of "
         f"{len(pairs)} timed runs, and run by run the ratio went from "
         f"{min(pairs):.0%} to {max(pairs):.0%} (one matmul lasts "
         f"{ns['matmul_seconds'] * 1e3:.2f} ms). "
         "Over 100% is inside that spread: Newton-Schulz ran at a plain matmul's rate, "
         "not faster.")

# %% [markdown]
# The record calls the package `dmuon`, its name at that commit: it became `muongrid` because
# X-Square-Robot's DMuon, another project ({doc}`chapter 16 <16_related_work>`), uses that
# package name. {doc}`Chapter 14 <14_on_a_gpu>` shows what each of those commands printed, and what
# one optimizer step cost there against `torch.optim.Muon`.
#
# ## The road ahead
#
# Every page of the book, in order, with the question it answers:

# %% jupyter={"source_hidden": true} tags=["remove-input"]
from muongrid.lab.roadmap import table_markdown

Markdown(table_markdown())

# %% [markdown]
# ## Summary
#
# - The algorithm lives in [`scripts/muongrid`](https://github.com/muongrid-book/distributed-muon/tree/main/scripts/muongrid); chapters launch it through scripts.
# - `verify.py` checks a distributed run against one process after every step: they agree exactly.
# - The same scripts run on a laptop (gloo) and on GPU clusters (`torchrun`, NCCL).
#
# ## Exercises
#
# 1. Run `verify.py` on a 3 x 1 grid with `--optimizer hybrid`. What changes in the JSON record?
# 2. Give it shapes that do not divide evenly, e.g. `--shapes 37x52,45x28 --tp-dims none,1 --tp 2`.
# 3. Try `--tp 3` with the default shapes. Read the error: which matrix cannot be split, and why?
# 4. Before running anything: how many collectives does each rank issue per step under
#    `verify.py --dp 4 --tp 2`, and under `--dp 8 --tp 4`? (The sentence under the verdict says what
#    one bucket costs and what a matrix split over TP adds.)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Exercise 4's answer, computed and checked (the solution below quotes it).
from muongrid.lab.costmodel import step_calls
from muongrid.lab.synthetic import build_problem
from muongrid.plan import DEFAULT_BUCKET_NUMEL

verify_groups = build_problem("muon", n_groups=2).groups  # verify.py's problem


def collectives_per_step(dp, tp):
    return len(list(step_calls(verify_groups, dp, tp, DEFAULT_BUCKET_NUMEL)))


# the closed form counts what the traced 2 x 2 run issued
assert collectives_per_step(2, 2) == sum(calls.values())
counts = {grid: collectives_per_step(*grid) for grid in ((4, 2), (8, 4))}
n_split = sum(d != -1 for g in verify_groups for d in g["tp_split_dims"])
assert set(counts.values()) == {3 * len(verify_groups) + n_split}
keep("ch0-ex4-count", counts[(4, 2)])
keep("ch0-ex4-split", n_split)

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
:::{admonition} Solutions
:class: dropdown

1. Run `python scripts/verify.py --dp 3 --tp 1 --optimizer hybrid`. The record's `optimizer`
   field reads `hybrid` and its grid is 3 x 1; the `ledger` phases are those of chapter 6. The
   verdict is still a difference of exactly zero: the AdamW part is elementwise, so sharding it
   changes no arithmetic.
2. The run passes: uneven shapes only change the padding of the buckets (chapter 4), never the
   arithmetic. A shape whose split dimension does not divide by `tp` is refused before launch.
3. The first matrix, 100 x 100, is split over TP along its rows, and 100 rows do not divide into
   3 equal slices; the script says so and exits before starting any process (chapter 3 runs it).
4. {{ch0-ex4-count}} on both, as on the 2 x 2 grid above. Each of the two buckets costs one
   reduce-scatter, one DP gather and one all-gather whatever `dp` is, and each of the
   {{ch0-ex4-split}} matrices split over TP costs one TP gather whatever `tp` is (above one). A
   larger grid sends more bytes per collective, not more collectives. (Computed with
   `muongrid.lab.costmodel.step_calls`, whose count for 2 x 2 the build checks against the run's
   ledger.)
:::
""")
