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
# # 10. Checkpoints and failures
#
# ```{admonition} What this chapter runs
# Two optimizers saved in this kernel, a checkpoint saved on a 2 x 2 grid and
# resumed on two others, a save killed half-way, and five kinds of fault injected into a short run.
# Reading: about 30 minutes at 200 words, 8 lines of code or one figure a minute, plus running it. Read first: {doc}`chapter 5 <05_distributed_step>`.
# ```
#
# A long run is interrupted sooner or later and may come back on other machines, perhaps fewer.
# It must then continue **exactly** where it stopped, even on another grid and layout; and when
# something goes wrong it must **end**, all of it, naming the rank and the cause. A silently wrong
# resume looks like a training instability; a hung rank can hold an allocation for hours.
#
# **Learning goals.** After this chapter you can
#
# - say what a Muon checkpoint holds, and why its optimizer state is half of AdamW's;
# - save on one grid and layout and resume on another, and check that the run is the one that was
#   never interrupted;
# - tell a checkpoint that can be trusted from one that cannot, before anything is loaded;
# - read a failed run's report: who failed first, why, and what the other ranks' errors mean.

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
    wanted = []
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
# ## What a Muon checkpoint holds
#
# The tiny GPT of {doc}`chapter 1 <01_muon>` with the hybrid split, a Distributed Muon and a
# Distributed AdamW in this process (1 x 1), each saved with `muongrid.checkpoint.save` into a
# `torch.distributed.checkpoint` folder ({term}`DCP`, {cite:t}`pytorch2025dcp`), whose metadata
# gives every tensor's bytes without loading it:

# %%
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.distributed.checkpoint as dcp
from muongrid.lab.page import keep, listing, say, show

from muongrid import DistributedAdamW, DistributedMuon, Grid, hybrid_param_groups
from muongrid import checkpoint
from muongrid.lab.charlm import TinyGPT
from muongrid.lab.notebook import last_json, run, table

torch.manual_seed(0)
model = TinyGPT(vocab_size=96)
work = Path(tempfile.mkdtemp())
kinds = ("model", "master", "momentum", "exp_avg", "exp_avg_sq")
saved = {}
for name, cls in [("Muon (hybrid)", DistributedMuon), ("AdamW", DistributedAdamW)]:
    opt = cls(hybrid_param_groups(model.named_parameters()), Grid.single())
    checkpoint.save(opt, work / name.split()[0], step=0)
    entries = (dcp.FileSystemReader(str(work / name.split()[0]))
               .read_metadata().state_dict_metadata)
    per_kind = dict.fromkeys(kinds, 0)
    for key, entry in entries.items():
        if hasattr(entry, "size") and not key.endswith(".step"):
            kind = "model" if key.startswith("model.") else key.rsplit(".", 1)[1]
            per_kind[kind] += entry.size.numel() * entry.properties.dtype.itemsize
    saved[name] = per_kind
    if cls is DistributedMuon:
        keys = {k: tuple(v.size) for k, v in entries.items()
                if "blocks.0.fc.weight" in k}
table(["kind of tensor", *saved],
      [[k, *(f"{saved[n][k] / 2**20:.2f} MiB" for n in saved)] for k in kinds])
print("what the Muon checkpoint holds for one matrix (key, whole shape):",
      *(f"{k:<40} {shape}" for k, shape in sorted(keys.items())), sep="\n  ")

# %% mystnb={"figure": {"name": "fig-ch10-state", "caption": "What the two checkpoints of the same tiny GPT hold, read from their DCP metadata. Both keep the model and the fp32 master weights; Muon keeps one moment (the momentum) for the matrices it orthogonalises, AdamW keeps two (`exp_avg`, `exp_avg_sq`) for everything."}}
moments = {n: sum(v[k] for k in ("momentum", "exp_avg", "exp_avg_sq"))
           for n, v in saved.items()}
muon_names = {n for g in hybrid_param_groups(model.named_parameters()) if g["use_muon"]
              for n in g["names"]}
muon_share = (sum(p.numel() for n, p in model.named_parameters() if n in muon_names)
              / sum(p.numel() for p in model.parameters()))
state_ratio = moments["Muon (hybrid)"] / moments["AdamW"]
with_master = ((saved["Muon (hybrid)"]["master"] + moments["Muon (hybrid)"])
               / (saved["AdamW"]["master"] + moments["AdamW"]))
print(f"Muon routes {muon_share:.0%} of the parameters; its moments are "
      f"{state_ratio:.3f} of AdamW's, "
      f"{with_master:.3f} with the fp32 master weights")

fig, ax = plt.subplots(figsize=(6.4, 2.6))
from muongrid.lab import palette

colors = palette.STATE  # the colours of this state in every figure of the book
for row, (name, per_kind) in enumerate(saved.items()):
    left = 0.0
    for kind in kinds:
        width = per_kind[kind] / 2**20
        ax.barh(row, width, left=left, color=colors[kind],
                label=kind if row == 0 else None)
        left += width
ax.set(yticks=range(len(saved)), yticklabels=list(saved),
       xlabel="MiB in the checkpoint")
ax.invert_yaxis()
ax.legend(ncol=5, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35),
          frameon=False)
fig.tight_layout()
show(fig)
plt.close(fig)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
# one moment instead of two, on the Muon share only
assert abs(state_ratio - (1 - muon_share / 2)) < 1e-9
keep("ch10-muon-share", f"{muon_share:.0%}")
keep("ch10-state-ratio", f"{state_ratio:.2f}")
keep("ch10-master-ratio", f"{with_master:.2f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
Muon keeps one momentum per matrix where AdamW keeps two moments: exactly half, on the matrices
Muon handles. Those are {{ch10-muon-share}} of this model's parameters (embeddings and head stay
with AdamW), so its moments come to {{ch10-state-ratio}} of AdamW's, and
{{ch10-master-ratio}} with the fp32 master weights both keep. On a large model, nearly all
matrices, the moments approach the paper's half.
""")

# %% [markdown]
# **The keys are names, the tensors are whole.** Each state tensor is stored under
# `optim.state.<parameter name>.<kind>` with the *whole* parameter's shape, whatever grid wrote it:
# each rank writes the rectangles its ZeRO-1 piece covers (at most three: a partial row, whole
# rows, a partial row), and DCP records which file holds which. That is DCP's own convention, but
# its `get_state_dict` expects DTensor placements, which a ZeRO-1 cut through a matrix's rows is
# not, so [`muongrid/checkpoint.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/checkpoint.py)
# describes the rectangles itself. Grid, layout, shapes and hyperparameters go to a small
# `muongrid.json` beside the data.

# %% [markdown]
# ## Save on one grid, resume on another
#
# `verify.py` runs the hybrid optimizer three steps on a 2 x 2 grid (bucket layout) and saves.
# Two runs load it, on four DP ranks (owner layout) and in one process, run three more steps, and
# compare each step with a single-device run never interrupted:

# %%
folder = work / "run"
problem = "--optimizer hybrid"
run(f"verify.py --dp 2 --tp 2 --steps 3 --save {folder} {problem}", log="collapsed")
resumed = {(dp, tp, layout): last_json(run(f"verify.py --dp {dp} --tp {tp} "
                                           f"--layout {layout} --steps 3 "
                                           f"--resume {folder} {problem}",
                                           log="collapsed"))
           for dp, tp, layout in [(4, 1, "owner"), (1, 1, "bucket")]}

# %%
rows, exact = [], []
for (dp, tp, layout), res in resumed.items():
    came = res["resumed_from"]
    diffs = res["layouts"][layout]["per_step_max_abs_diff"]
    rows.append([f"{came['saved_on']['dp']} x {came['saved_on']['tp']}, "
                 f"{came['saved_on']['layout']}",
                 f"{dp} x {tp}, {layout}",
                 f"steps {came['step'] + 1}-{came['step'] + len(diffs)}",
                 ", ".join(f"{d:g}" for d in diffs)])
    exact.append(res["ok"] and res["max_abs_diff"] == 0.0 and came["step"] == 3)
table(["saved on", "resumed on", "compared",
       "max |param - uninterrupted run| per step"], rows)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
assert all(exact), "a resumed run differs from the uninterrupted one"

# %% [markdown]
# Zero at every step: the resumed runs are the uninterrupted run, bit for bit, on another DP size
# and layout and in one process (exact for the reason {doc}`chapter 5 <05_distributed_step>`
# gives). The tests repeat it from 2 x 2 into 3 x 1, 1 x 4, 3 x 2 and 1 x 1, with every layout.
#
# Without DCP: `checkpoint.export(folder, "ckpt.pt")` writes one plain file that
# `torch.load(..., weights_only=True)` reads, and `checkpoint.load_single` puts it into the
# single-device `MuonW` or PyTorch's `torch.optim.Muon`
# ([`tests/test_checkpoint.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_checkpoint.py)
# continues a run there: bit for bit with a native bf16 matrix product, within a bf16 rounding of
# the update elsewhere):

# %%
checkpoint.export(folder, work / "ckpt.pt")
plain = torch.load(work / "ckpt.pt", weights_only=True)
print(f"{work.name}/ckpt.pt: {len(plain) - 1} tensors, "
      f"{(work / 'ckpt.pt').stat().st_size / 2**20:.1f} MiB, e.g.")
for key in sorted(k for k in plain if k.startswith("optim.state.layers.3.weight")):
    print(f"  {key:<40} {tuple(plain[key].shape)} {str(plain[key].dtype)[6:]}")

# %% [markdown]
# ## A save that dies half-way
#
# A rank can die after some files are written. `checkpoint.save` writes into `<path>.partial`;
# only when every rank has finished does rank 0 write `muongrid.json` and move the folder over the
# previous checkpoint. Below, a run saves after step 1, then a second run's rank 1 dies while saving
# after step 2 (`MUONGRID_DIE_WHILE_SAVING=1`):

# %%
safe = work / "safe"
run(f"verify.py --dp 2 --steps 1 --save {safe} {problem}", log="collapsed")
run(f"verify.py --dp 2 --steps 2 --save {safe} {problem}", expect_failure=True,
    log="collapsed", env={"MUONGRID_DIE_WHILE_SAVING": "1"})
partial = Path(f"{safe}.partial")
marker = "present" if (partial / "muongrid.json").exists() else "absent"
print(f"{safe.name}.partial: {len(list(partial.glob('*.distcp')))} data files, "
      f"muongrid.json {marker}")
print(f"{safe.name}: the checkpoint of step {checkpoint.read_marker(safe)[1]['step']}, "
      "untouched")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert (not (partial / "muongrid.json").exists()
        and checkpoint.read_marker(safe)[1]["step"] == 1)

# %% [markdown]
# The half-written folder has no marker, and `checkpoint.load` refuses it. Loading checks the
# marker against the optimizer (names, shapes, kinds) before it reads a byte, and reads into fresh
# tensors first, so a failed load changes nothing. Three ways to get it wrong:

# %%
from muongrid.lab.synthetic import DEFAULT_SHAPES, build_problem  # noqa: E402

corrupt = work / "corrupt"
corrupt.mkdir()
for f in folder.iterdir():
    data = f.read_bytes()
    (corrupt / f.name).write_bytes(data[: len(data) // 2] if f.suffix == ".distcp"
                                   else data)
other_shapes = [(h, w + 1) if i == 3 else (h, w)
                for i, (h, w) in enumerate(DEFAULT_SHAPES)]
attempts = [
    ("another model (one matrix one column wider)", DistributedMuon, other_shapes,
     folder),
    ("another optimizer (AdamW)", DistributedAdamW, DEFAULT_SHAPES, folder),
    ("the data files cut in half", DistributedMuon, DEFAULT_SHAPES, corrupt),
    ("a half-written save", DistributedMuon, DEFAULT_SHAPES, partial),
]
rows, refused = [], []
for what, cls, shapes, path in attempts:
    target = cls(build_problem("hybrid", shapes).param_groups(), Grid.single())
    before = [p.detach().clone() for g in target.param_groups for p in g["params"]]
    try:
        checkpoint.load(target, path)
        message = "loaded (this should not happen)"
    except checkpoint.CheckpointError as e:
        lines = str(e).replace(str(work), "…").splitlines()
        message = (" ".join(line.strip() for line in lines[:2])
                   + (f"; … ({len(lines) - 1} in all)" if len(lines) > 2 else ""))
    unchanged = all(torch.equal(a, p) for a, p in
                    zip(before, (p for g in target.param_groups for p in g["params"])))
    rows.append([what, message, "yes" if unchanged else "NO"])
    refused.append(unchanged and not message.startswith("loaded"))
table(["loading", "the error", "parameters unchanged"], rows, align="lll")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
assert all(refused), "a bad checkpoint loaded, or changed the parameters"

# %% [markdown]
# ## When a rank fails
#
# The failing rank is rarely the one that reports first: if rank 1 raises, its peers fail too,
# waiting in a collective, with errors that say nothing about the cause. The launcher
# ([`muongrid/launch.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/launch.py))
# names the rank that failed **first** with its full traceback, every other rank in one line
# (`--- then ...`), stops every rank and exits 1. A rank killed by a signal is the root cause;
# ranks the launcher stopped are never blamed. A hung rank is ended by its peers' collective
# timeout (`--timeout`) or, if the backend never returns, by the
# {term}`watchdog <collective timeout>` in [`muongrid/comm.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/comm.py).
#
# [`scripts/faults.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/faults.py)
# knows eight faults, injected on one rank at step 2; the five whose endings differ most run here
# on a 2 x 1 grid, rank 1 misbehaving (logs folded; the table has the verdict, the first failing
# rank's last words cut at 180 characters, and the run's time).
# [`tests/test_failures.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_failures.py)
# runs all eight on 2 x 1 and 2 x 2 grids.

# %%
import time  # noqa: E402

from muongrid.lab.faultcheck import EXPECTED, first_failure, judge  # noqa: E402

SHOWN = ["raise", "kill", "hang", "shape-mismatch", "corrupt-checkpoint"]
rows, judged = [], {}
for fault in SHOWN:
    start = time.monotonic()
    out = run(f"faults.py --dp 2 --tp 1 --fault {fault} --rank 1 --step 2 --timeout 4",
              expect_failure=True, log="collapsed")
    seconds = time.monotonic() - start
    verdict, last_words = first_failure(out)
    short = last_words if len(last_words) <= 180 else last_words[:180] + " …"
    rows.append([fault, verdict, short, f"{seconds:.0f} s"])
    judged[fault] = judge(fault, 2, 1, 1, 1, out, out)  # what went wrong, if anything
table(["fault", "the launcher's verdict", "the first failing rank's last words",
       "whole run"], rows, align="llll")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert set(SHOWN) <= set(EXPECTED)
assert not any(judged.values()), judged

# %% [markdown]
# How to read the rows:
#
# - **raise** (and nan, wrong-dtype): the gradient checks run before the step's communication, so
#   the message names the parameter, rank and step, and nothing has changed.
# - **kill**: SIGKILL, as from the out-of-memory killer, leaves no traceback; the launcher says how
#   rank 1 died, and its peer, stuck in the reduce-scatter, is not blamed.
# - **hang** (and watchdog): the peer's collective times out after `--timeout` seconds, naming the
#   operation, group and phase; a rank the watchdog ends (exit code 3) ends the whole run.
# - **shape-mismatch**: the ranks compare plans in one all-gather when the optimizer is built, so
#   all fail at once with the parameter's name, before two parameters' elements could mix.
# - **corrupt-checkpoint**: DCP gathers the ranks' read errors, so every rank fails alike.
#
# {doc}`The troubleshooting page <../book/troubleshooting>` lists each message with what to do.
# Under `torchrun` PyTorch's elastic agent supervises the ranks; for local runs the book's own
# small launcher does, because the agent alone names no grid coordinates and waits 30 s on a rank
# that ignores SIGTERM.
#
# ### Every time, and under load
#
# A failure path that works on an idle machine can still hang or leave processes behind on a busy
# one (both happened to earlier versions of this launcher).
# [`scripts/fault_bench.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/fault_bench.py)
# repeats every fault 20 times under CPU load and counts clean endings (exit code 1, right message,
# right rank first) and processes left behind. The recorded result:

# %%
from muongrid.lab.provenance import load_recorded, provenance_text  # noqa: E402

bench = load_recorded("fault_bench_2x1.json")
table(["fault", "runs", "clean", "slowest run", "slowest, from the fault",
       "processes left", "load average"],
      [[f, r["runs"], r["clean"], f"{r['slowest_exit_s']:.0f} s",
        "-" if r["slowest_after_fault_s"] is None
        else f"{r['slowest_after_fault_s']:.0f} s", r["leftovers"],
        r["load_average_1min"]] for f, r in bench["per_fault"].items()],
      align="lrrrrrr")
print(provenance_text(bench))
for fault, r in bench["per_fault"].items():
    if r["problems"]:
        print(f"{fault}: {r['runs'] - r['clean']} run(s) not clean: "
              f"{'; '.join(r['problems'])}")
missing = [f for f in EXPECTED if f not in bench["per_fault"]]
if missing:
    print(f"this recording was cut short: {', '.join(missing)} did not run "
          "(the tests run every fault once)")

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
keep("ch10-bench-clean", f"{sum(r['clean'] for r in bench['per_fault'].values())} of "
     f"{sum(r['runs'] for r in bench['per_fault'].values())}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
{{ch10-bench-clean}} runs ended cleanly. "Slowest, from the fault" runs from the end of step 1
to the end of the run: for a hang, the timeout (5 s here) plus the time to stop every rank. The
load average is the machine's when the fault's last run ended.
""")

# %% [markdown]
# ## Summary
#
# - A checkpoint stores every state tensor whole, keyed by parameter name, so it loads on any
#   grid, layout or one process; with the checks' synthetic gradients a resume is bit for bit, with
#   a real model's it agrees to rounding ({doc}`chapter 9 <09_training>`).
# - Muon's optimizer state is one moment per matrix, AdamW's two: half on the matrices Muon handles.
# - A save is complete only when its marker exists; a load checks before it reads and changes
#   nothing when it fails.
# - A failed run ends whole, names the rank that failed first and why, and leaves nothing behind;
#   a hang ends after the collective timeout.
#
# ## Exercises
#
# 1. Save after two steps on `--dp 3 --tp 2 --layout aligned` and resume on `--dp 2 --tp 1` with
#    the owner layout. Which files did each of the six ranks write, and which does each of the two
#    new ranks read?
# 2. Run `python scripts/faults.py --dp 2 --tp 2 --fault hang --rank 0 --timeout 120` and, while it
#    hangs, `kill -9` the pid that rank 3 printed. Who is named first, and why not rank 0?
# 3. Why does a Muon checkpoint need the fp32 master weights at all, when the model's own weights
#    are saved beside them?
# 4. In the 2 x 2 run saved above, `layers.3.weight` (676 x 876) is split over TP along its
#    columns, and ZeRO-1 cuts TP rank 0's shard between the two DP ranks. Which rectangles of the
#    whole matrix does each of those two ranks write? Use `build_plan` for where the cut falls, then
#    work out the rectangles by hand and check them with `checkpoint.rectangles`.

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# The exercises' answers, computed and checked (the solutions below quote them).
from muongrid.lab.costmodel import plans_for
from muongrid.plan import DEFAULT_BUCKET_NUMEL, tp_local_shape

saved_groups = build_problem("hybrid").groups  # the problem the 2 x 2 run saved
g, i = 0, saved_groups[0]["names"].index("layers.3.weight")
shape, split = saved_groups[g]["shapes"][i], saved_groups[g]["tp_split_dims"][i]
local = tp_local_shape("layers.3.weight", shape, split, 2)
rects = {}
for dp_rank, plan in enumerate(plans_for(saved_groups, 2, 2, DEFAULT_BUCKET_NUMEL, "bucket")):
    meta = plan.metas[g][i]
    start = meta.local_range[0] - meta.global_range[0] if meta.local_numel else 0
    piece = slice(start, start + meta.local_numel)
    rects[dp_rank] = [(off, size) for off, size, _, _ in checkpoint.rectangles(local, split, 0, piece)]
# the two DP ranks' rectangles tile TP rank 0's columns of the matrix, with no overlap
covered = torch.zeros(shape, dtype=torch.int)
for (r0, c0), (h, w) in (x for xs in rects.values() for x in xs):
    covered[r0:r0 + h, c0:c0 + w] += 1
assert covered[:, :local[1]].eq(1).all() and covered[:, local[1]:].eq(0).all()
assert 1 <= len(rects[0]) <= 3 and 1 <= len(rects[1]) <= 3


def as_text(rs):
    rows = [f"row {r}" if h == 1 else f"rows {r}-{r + h - 1}" for (r, _), (h, _) in rs]
    return "; ".join(f"{rw}, columns {c}-{c + w - 1}" for rw, ((_, c), (_, w)) in zip(rows, rs))


keep("ch10-ex4-local", f"{local[0]} x {local[1]}")
keep("ch10-ex4-dp0", as_text(rects[0]))
keep("ch10-ex4-dp1", as_text(rects[1]))
keep("ch10-ex4-n0", ["one rectangle", "two rectangles", "three rectangles"][len(rects[0]) - 1])
keep("ch10-ex4-cut", f"{rects[0][-1][0][0] * local[1] + rects[0][-1][0][1] + rects[0][-1][1][1]:,}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
:::{admonition} Solutions
:class: dropdown

1. Each of the six ranks writes one `__<rank>_0.distcp` file holding the rectangles of its pieces
   (a TP-replicated matrix is written by TP rank 0 only). DCP's metadata maps every rectangle to a
   file and an offset, so each new rank reads the parts of those files that overlap its own pieces,
   usually from several of them.
2. Rank 3: it died of a signal the launcher did not send, which nothing else explains. Rank 0
   only stopped answering; the launcher stops it, and ranks the launcher stopped are never blamed.
   (With a short `--timeout`, the waiting ranks' collectives would time out first and be named.)
3. With bf16 (or any lower-precision) parameters, the master weights are the only exact copy: the
   optimizer updates them in fp32 and rounds into the model, so resuming from the rounded model
   would lose the small updates that had not yet changed a bf16 value. Here the model is fp32 and
   the two are equal, but the format does not assume it.
4. TP rank 0 holds columns 0-437, a {{ch10-ex4-local}} shard, flattened row by row; the
   bucket's cut falls after its first {{ch10-ex4-cut}} elements. DP rank 0 writes
   {{ch10-ex4-n0}}: {{ch10-ex4-dp0}}. DP rank 1 writes the rest:
   {{ch10-ex4-dp1}}. A flat range starts with a partial row, continues with whole rows and ends
   with a partial row, so it is never more than three rectangles. (The build checks that the
   rectangles cover TP rank 0's columns exactly once.)
:::
""")
