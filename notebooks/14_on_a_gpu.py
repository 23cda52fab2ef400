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
# # 14. On a GPU
#
# ```{admonition} What this chapter runs
# No GPU: it reads the project's one-GPU record (a run made outside this build, kept with its
# provenance in `book/data/`) and counts one optimizer step of today's code on the meta device
# (the shapes of three real models, no memory, no kernels: about 15 seconds).
# Reading: about 10 minutes at 200 words, 8 lines of code or one figure a minute, plus running it. Read first: {doc}`chapter 13 <13_what_to_pick>`.
# ```
#
# Every other page runs on a CPU over gloo. This one shows what the same code did on one H100.
#
# **Learning goals.** After this page you can
#
# - say what a one-GPU run of the book's code prints and costs, and where its figures come from;
# - read Newton-Schulz's throughput against a GPU's matmul ceiling, and say why the rest of the
#   optimizer step is memory traffic;
# - predict a step's GPU time from the bytes it moves, and say which figure on this page is
#   measured, which is counted and which is modelled.

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
# ## The record
#
# The figures below come from one run made by hand on a lent machine
# ([`muongrid/lab/gpurecord.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/lab/gpurecord.py)
# parses its logs). Every figure is that older commit's, when the package was called `dmuon`.

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from IPython.display import Markdown, display
from muongrid.lab.page import keep, listing, say, show

from muongrid.lab import gpurecord
from muongrid.lab.notebook import table

record = gpurecord.load()
display(Markdown(gpurecord.provenance_text(record).replace("\n  ", "  \n")))
display(Markdown(f"**Since then:** {gpurecord.CHANGED_SINCE}."))

# %% [markdown]
# One GPU is a world of one rank: NCCL ran, but no collective crossed a link, so everything that
# needs several ranks is still checked on gloo. What ran, with exit code and wall time (start-up and
# kernel compilation included):

# %% tags=["hide-input"] jupyter={"source_hidden": true}
table(["step", "command", "exit", "seconds"], gpurecord.command_rows(record),
      align="llrr")
total_s = sum(s["seconds"] for s in record["steps"])

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert all(s["rc"] == 0 for s in record["steps"])
keep("ch14-total-min", f"{total_s / 60:.1f}")
keep("ch14-commands", len(record["steps"]))

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
All {{ch14-commands}} commands exited 0, in {{ch14-total-min}} minutes. The GPU
printed what the CPU chapters show: a ledger of 0 bytes, a largest difference of 0 against one
process on every layout, the training loop and its resume, and the FSDP2 run beside
`torch.optim.Muon` (ours first, then torch's: the same final loss):
""")

# %% tags=["hide-input"] jupyter={"source_hidden": true}
print(gpurecord.printed(record))

# %% [markdown]
# ## Newton-Schulz against the matmul ceiling
#
# Newton-Schulz is fifteen matrix products per matrix, so its ceiling is the bf16 matmul rate.
# The record measured it alone on one 4096 x 4096 matrix and inside the optimizer step on
# Llama-3.2-1B's 112 matrices (profiled time against their FLOPs). {numref}`fig-ch14-roofline`
# sets both against the datasheet peak and the rate the time model of
# {doc}`chapter 13 <13_what_to_pick>` charges.

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-ch14-roofline", "caption": "bf16 throughput on one H100, from the GPU record: matmuls (grey) and Newton-Schulz (red), the fastest of several runs alone and the profiled time inside the optimizer step; dashed, NVIDIA's dense bf16 peak; dotted, the rate the book's time model charges Newton-Schulz (half the peak)."}} jupyter={"source_hidden": true}
import matplotlib.pyplot as plt

from muongrid import hardware
from muongrid.lab import palette

rates = gpurecord.derived(record)
ns = record["ns_speed"]
bars = [("bf16 matmul\n4096^3", ns["best_matmul_gflops"] * 1e9, palette.NEUTRAL["sum"]),
        ("Newton-Schulz\n4096 x 4096", rates["ns5_4096"],
         palette.STEP["newton_schulz"]),
        ("Newton-Schulz in\nthe Llama-1B step", rates["ns_in_step"],
         palette.STEP["newton_schulz"]),
        ("bf16 matmul\n8192^3", rates["matmul_bf16"], palette.NEUTRAL["sum"])]
peak = hardware.figure("peak_bf16")
charged = peak * hardware.figure("ns_efficiency")
fig, ax = plt.subplots(figsize=(7.2, 3.6))
ax.bar(range(len(bars)), [b[1] / 1e12 for b in bars], color=[b[2] for b in bars],
       edgecolor=palette.NEUTRAL["edge"], width=0.6)
for i, (_, value, _) in enumerate(bars):
    ax.text(i, value / 1e12 + 12, f"{value / 1e12:.0f}", ha="center", fontsize=9)
ax.axhline(peak / 1e12, color=palette.NEUTRAL["reference"], ls="--", lw=1,
           label="datasheet peak (dense bf16)")
ax.axhline(charged / 1e12, color=palette.OPTIMIZER["muon"], ls=":", lw=1.5,
           label="the time model's Newton-Schulz rate")
ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=9)
ax.set(ylabel="TFLOP/s (bf16), one H100", ylim=(0, 1050))
ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False,
          fontsize=9)
fig.tight_layout()
show(fig)
plt.close(fig)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert ns["best_ratio"] > 1 and rates["ns_in_step"] > charged
keep("ch14-ns-ratio", f"{ns['best_ratio']:.0%}")
keep("ch14-ns-step", f"{rates['ns_in_step'] / 1e12:.0f}")
keep("ch14-ns-step-share", f"{rates['ns_in_step'] / rates['matmul_bf16']:.0%}")
keep("ch14-charged", f"{charged / 1e12:.0f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
On one 4096 x 4096 matrix Newton-Schulz ran at {{ch14-ns-ratio}} of a bf16 matmul of
the same size: it *is* matmuls, back to back. Inside the step, on Llama-3.2-1B's smaller
matrices batched by shape, it ran at {{ch14-ns-step}} TFLOP/s, {{ch14-ns-step-share}}
of the 8192^3 ceiling. The time model charges {{ch14-charged}} TFLOP/s, below every
measured rate, so a modelled Muon step errs long.
""")

# %% [markdown]
# ## One optimizer step, before the rebuild
#
# One `step()` on real model shapes, fp32 parameters, random gradients, one process: CUDA events,
# median of 10 after 3 warm-up steps; "host" is the time until `step()` returned, "syncs" what
# `torch.cuda.set_sync_debug_mode` counted. **These are commit 7b306af's steps**, before the
# rebuild.

# %% tags=["hide-input"] jupyter={"source_hidden": true}
table(["shapes", "optimizer", "GPU ms", "host ms", "syncs", "x torch Muon"],
      gpurecord.step_rows(record), align="llrrrr")
llama = {k: v for m in record["bench"]["models"] if m["model"] == "llama-1b"
         for k, v in m["runs"].items()}
gap_ms = llama["dmuon_owner_batch"]["gpu_ms"] - llama["torch_hybrid"]["gpu_ms"]
prof = record["profile_ms_two_steps"]

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
keep("ch14-old-gap", f"{gap_ms:.0f}")
keep("ch14-old-copies", f"{prof['ours_copies'] / 2:.0f}")
keep("ch14-old-ns", f"{prof['ours_newton_schulz'] / 2:.0f}")
keep("ch14-torch-ns", f"{(prof['torch_addmm'] + prof['torch_mm']) / 2:.0f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
On Llama-3.2-1B's shapes our step then took {{ch14-old-gap}} ms longer than
torch's. Both spent about the same time in Newton-Schulz ({{ch14-old-ns}} ms a step
for ours, {{ch14-torch-ns}} for torch's); ours added {{ch14-old-copies}} ms of
device-to-device copies and two host syncs. The step around Newton-Schulz was memory traffic.
""")

# %% [markdown]
# ## What the rebuilt step moves, counted now

# %% tags=["hide-input"] jupyter={"source_hidden": true}
SHAPES = ("gpt2-124m", "llama-1b", "llama-8b-4layers")
counted = {m: gpurecord.count_step(m) for m in SHAPES}
table(["shapes", "GiB ours", "GiB torch", "ratio", "ops ours", "ops torch",
       "host syncs ours"],
      [[m, f"{c['ours']['bytes_gib']:.1f}", f"{c['torch']['bytes_gib']:.1f}",
        f"{c['bytes_ratio']:.2f}", c["ours"]["ops"], c["torch"]["ops"],
        c["ours"]["syncs"]] for m, c in counted.items()], align="lrrrrrr")
GiB = 2**30
bandwidths = (hardware.figure("hbm"), hardware.figure("elementwise"))   # fast, slow


def ms_range(gib):
    """Milliseconds to move ``gib`` GiB at the datasheet and the measured bandwidth."""
    low, high = (gib * GiB / b * 1e3 for b in bandwidths)
    return low, high


prior = gpurecord.PRIOR_COUNTS
prior_ms = ms_range(prior["ours_outside_ns_gib"] - prior["torch_outside_ns_gib"])
now = counted["llama-1b"]
now_ms = ms_range(now["ours"]["outside_ns_gib"] - now["torch"]["outside_ns_gib"])
torch_ms = llama["torch_hybrid"]["gpu_ms"]
ratios = [c["bytes_ratio"] for c in counted.values()]

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert prior_ms[0] < gap_ms < prior_ms[1]   # the count bracketed the record's gap
assert all(c["ours"]["syncs"] == 0 and c["bytes_ratio"] < 1.15
           for c in counted.values())
keep("ch14-prior-ours", f"{prior['ours_outside_ns_gib']:.1f}")
keep("ch14-prior-torch", f"{prior['torch_outside_ns_gib']:.1f}")
keep("ch14-prior-ms", "{:.0f}-{:.0f}".format(*prior_ms))
keep("ch14-now-ours", f"{now['ours']['outside_ns_gib']:.1f}")
keep("ch14-now-torch", f"{now['torch']['outside_ns_gib']:.1f}")
keep("ch14-now-ms", "{:.1f}-{:.1f}".format(*now_ms))
keep("ch14-predicted", "{:.0f}-{:.0f}".format(*(torch_ms + x for x in now_ms)))
keep("ch14-torch-ms", f"{torch_ms:.0f}")
keep("ch14-ratio-range", f"{min(ratios):.2f}-{max(ratios):.2f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
Outside Newton-Schulz a step's GPU time is its bytes over the memory's bandwidth, and the bytes
can be counted without a GPU: run the step on the **meta device** (shapes, no data) and add up
each operation's bytes ([`muongrid/lab/stepcost.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/lab/stepcost.py)). At the record's commit
our step moved {{ch14-prior-ours}} GiB outside Newton-Schulz against torch's
{{ch14-prior-torch}} GiB. At 3.35 TB/s (datasheet) to 2.56 TB/s (the record's fused
AdamW pass) the difference is {{ch14-prior-ms}} ms; the record measured
{{ch14-old-gap}} ms. The count predicts the GPU's time. Today's step
(`python scripts/step_bench.py`, run as this page was built; "ops" are aten operations, about one
kernel each):
""")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
Today's step moves {{ch14-ratio-range}} times torch's bytes (the extra is the NaN/Inf
check's read of the gradients), in far fewer operations (one per shape bank) and with no host
sync. On Llama-3.2-1B it moves {{ch14-now-ours}} GiB outside Newton-Schulz against
torch's {{ch14-now-torch}}: {{ch14-now-ms}} ms more, a predicted step of
{{ch14-predicted}} ms against torch's measured {{ch14-torch-ms}} ms, if its
Newton-Schulz runs as fast as torch's.
""")

# %% [markdown]
# ```{admonition} Not yet timed on a GPU
# :class: warning
# That prediction is a count: **the rebuilt step has not been timed on a GPU**. On a machine with
# one, `make record-gpu OUT=book/data/step_bench_gpu.json` times it against `torch.optim.Muon`,
# with its provenance, and this page then shows that record below.
# ```

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from muongrid.lab.provenance import ROOT, load_recorded, provenance_text

if (ROOT / "book" / "data" / "step_bench_gpu.json").exists():
    timed = load_recorded("step_bench_gpu.json")
    print(provenance_text(timed))
    table(["shapes", "torch ms", "ours ms", "floor ms", "ours / torch", "syncs"],
          gpurecord.step_bench_rows(timed), align="lrrrrr")
else:
    print("No GPU record of the rebuilt step yet (book/data/step_bench_gpu.json).")

# %% [markdown]
# ## The step in proportion
#
# A training step is mostly forward and backward. The record timed those on a `transformers`
# Llama-3.2-1B (random weights, bf16 autocast, median of 5 after 2 warm-up steps):

# %% tags=["hide-input"] jupyter={"source_hidden": true}
fb = record["fwd_bwd"]
table(["tokens a step", "forward + backward", "model TFLOP/s", "of the 8192^3 matmul",
       "peak memory"],
      [[f"{v['tokens']:,}", f"{v['fwd_bwd_ms']:.1f} ms", f"{v['tflops']:.0f}",
        f"{v['mfu_775']:.0%}", f"{v['peak_mem_gib']:.1f} GiB"]
       for k, v in fb.items() if isinstance(v, dict)], align="rrrrr")
fb_ms = fb["8x2048"]["fwd_bwd_ms"]
shares = {k: llama[k]["gpu_ms"] / (fb_ms + llama[k]["gpu_ms"])
          for k in ("torch_adamw_fused", "torch_hybrid", "dmuon_owner_batch")}

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
for k, v in shares.items():
    keep(f"ch14-share-{k}", f"{v:.1%}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
At 16,384 tokens a step the optimizer's share of the step was
{{ch14-share-torch_adamw_fused}} for fused AdamW, {{ch14-share-torch_hybrid}} for
`torch.optim.Muon` and {{ch14-share-dmuon_owner_batch}} for ours before the rebuild.
One GPU is Muon's worst case: it orthogonalises every matrix itself, where data parallelism
spreads that work over the ranks (the paper reports 1-3% at scale).
{doc}`Chapter 13 <13_what_to_pick>` models the whole step with this record's figures; its first
row is this configuration, held against the measurement:
""")

# %% tags=["hide-input"] jupyter={"source_hidden": true}
from muongrid.lab import wholestep

one = wholestep.whole_step(wholestep.CONFIGS[0])
owner = one["layouts"]["owner"]
table(["", "forward + backward", "AdamW step", "Muon + AdamW step", "Muon's share"],
      [["modelled (chapter 13)", f"{one['forward_backward'] * 1e3:.0f} ms",
        f"{one['layouts']['adamw']['total'] * 1e3:.1f} ms",
        f"{owner['total'] * 1e3:.0f} ms",
        f"{owner['optimizer_share'][0]:.1%}"],
       ["measured (torch.optim.Muon)", f"{fb_ms:.0f} ms",
        f"{llama['torch_adamw_fused']['gpu_ms']:.1f} ms",
        f"{llama['torch_hybrid']['gpu_ms']:.0f} ms", f"{shares['torch_hybrid']:.1%}"]],
      align="lrrrr")
model_vs_torch = owner["total"] * 1e3 / llama["torch_hybrid"]["gpu_ms"]

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert one["config"].dp * one["config"].tp == 1
assert 0.8 < model_vs_torch < 1.25
keep("ch14-model-vs-torch", f"{abs(model_vs_torch - 1):.0%}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
The modelled Muon step is within {{ch14-model-vs-torch}} of `torch.optim.Muon`'s
measured one. Forward and backward are modelled short (6 x parameters x tokens, attention left
out), so chapter 13's modelled shares err large.
""")

# %% [markdown]
# ## Summary
#
# - On one H100 every path ran under `torchrun` and NCCL; Newton-Schulz ran at the matmul ceiling.
# - Outside Newton-Schulz a step's GPU time is bytes over bandwidth; counted on the meta device,
#   they bracketed the record's gap.
# - The rebuilt step moves a few percent more bytes than `torch.optim.Muon`, never syncs the host,
#   and is not yet timed on a GPU (`make record-gpu`).
#
# ## Exercises

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# The solutions' figures.
gpt2 = next(m for m in record["bench"]["models"] if m["model"] == "gpt2-124m")["runs"]
keep("ch14-gpt2-gpu", f"{gpt2['torch_hybrid']['gpu_ms']:.1f}")
keep("ch14-gpt2-host", f"{gpt2['torch_hybrid']['host_ms']:.1f}")
keep("ch14-gpt2-ops", counted["gpt2-124m"]["ours"]["ops"])
keep("ch14-gpt2-torch-ops", counted["gpt2-124m"]["torch"]["ops"])
graph = record["graph"]["gpt2-124m"]
assert graph["graph_ms"] < 0.6 * graph["eager_ms"]
keep("ch14-graph-eager", f"{graph['eager_ms']:.1f}")
keep("ch14-graph-replay", f"{graph['graph_ms']:.1f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
1. On GPT-2's shapes torch's step took {{ch14-gpt2-gpu}} ms of GPU time and its host
   {{ch14-gpt2-host}} ms to issue it. Which count of the meta-device table predicts
   the rebuilt step's time there, its bytes or its operations, and why?
2. The record's fused AdamW pass read and wrote 28 bytes per parameter. Why 28?

:::{admonition} Solutions
:class: dropdown

1. Its operations. When the host takes as long to issue a step as the GPU takes to run it, the
   GPU waits for launches: the step is bound by how many kernels it launches, not by the bytes
   they move. The rebuilt step issues {{ch14-gpt2-ops}} aten operations where torch's
   issues {{ch14-gpt2-torch-ops}}. The record shows the same from the other side:
   capturing torch's GPT-2 step in one CUDA graph (one launch) took it from
   {{ch14-graph-eager}} to {{ch14-graph-replay}} ms.
2. It reads the parameter, the gradient and both moments (4 x 4 bytes in fp32) and writes the
   parameter and both moments back (3 x 4): 28 bytes, in one pass.
:::
""")
