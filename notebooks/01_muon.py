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
# # 1. Muon from first principles
#
# ```{admonition} What this chapter runs
# One process only: a gradient of a tiny GPT, Newton-Schulz and SVD timings, and the tiny GPT
# trained twice for 100 steps (AdamW, then MuonW). About a minute on a 2-core laptop.
# Reading: about 35 minutes at 200 words, 8 lines of code or one figure a minute, plus running it. Read first: nothing but PyTorch.
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
# Muon {cite:p}`jordan2024muon` is an optimizer for the weight *matrices* of a network. It keeps
# a momentum matrix like SGD does, but before using it as the update it replaces the momentum
# by the nearest "orthogonal" matrix: same directions, every direction the same size.
#
# **Learning goals.** After this chapter you can
#
# - show that gradient matrices of a real network have a few dominant directions (a skewed spectrum);
# - explain what orthogonalising an update does to its singular values, and why that helps;
# - derive how NS5 acts on singular values and read its coefficients off a plot;
# - write down a full Muon step (momentum, Nesterov, NS5, lr adjustment, weight decay);
# - say which parameters the hybrid gives to Muon and which to AdamW, and why.

# %% [markdown]
# ## A real gradient has a skewed spectrum
#
# Our running example is a tiny GPT that predicts the next character of Python's own help texts
# (`pydoc_data.topics`, which ships with every Python). The model and the data are in
# [`scripts/muongrid/lab/charlm.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/lab/charlm.py). Here are the singular values of one weight matrix's
# gradient on one batch.

# %%
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from muongrid.lab.page import keep, listing, say, show

from muongrid.lab.charlm import TinyGPT, batch, load_corpus
from muongrid.lab import palette
from muongrid.lab.diagrams import book_style

book_style()

torch.manual_seed(0)
data = load_corpus()
print(f"corpus: {data['n_chars']:,} characters, {data['vocab_size']} distinct; "
      f"{len(data['train']):,} for training, {len(data['val']):,} held out")
model = TinyGPT(data["vocab_size"])
x, y = batch(data["train"], 32, model.context, torch.Generator().manual_seed(0))
F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
G = model.blocks[0].fc.weight.grad.clone()  # the first MLP matrix of block 0
s = torch.linalg.svdvals(G)
energy = (s**2).cumsum(0) / (s**2).sum()
print(
    f"gradient of blocks.0.fc.weight: shape {tuple(G.shape)}, {len(s)} singular values"
)
print(f"largest / median singular value: {s[0] / s.median():.1f}")
print(f"the top 5 directions carry {energy[4]:.0%} of the gradient's squared norm")

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-ch1-spectrum", "caption": "Singular values of the gradient of `blocks.0.fc.weight`, largest first, on a log scale."}} jupyter={"source_hidden": true}
fig, ax = plt.subplots(figsize=(6.4, 3.4))
ax.semilogy(s.numpy(), marker=".", lw=1)
ax.set(xlabel="index (largest first)", ylabel="singular value")
ax.grid(alpha=0.3)
fig.tight_layout()
show(fig)
plt.close(fig)

# %% [markdown]
# {numref}`fig-ch1-spectrum` shows the skew: a plain gradient step moves the weights mostly along a handful of directions.
# Adam's per-element scaling does not fix this: it knows nothing of the matrix structure. Muon
# keeps the directions and **equalises their sizes**.
#
# ## Orthogonalisation
#
# Write the update as a singular value decomposition $G = U \Sigma V^\top$. Its *orthogonalisation*
# is $O = U V^\top$: the same left and right singular vectors, every singular value set to 1. For
# a wide or tall matrix, $O$ has orthonormal rows or columns. It is the orthogonal matrix nearest
# to $G$ in Frobenius norm, and the steepest-descent direction when a step's size is measured by
# its spectral norm. An SVD computes $O$ exactly but is slow and sequential on accelerators; Muon
# uses a polynomial instead.
#
# ## Newton-Schulz: a polynomial that pushes singular values to 1
#
# An odd polynomial of a matrix acts on its singular values alone:
# $X \mapsto aX + b\,(XX^\top)X + c\,(XX^\top)^2X$ maps $U \Sigma V^\top$ to $U\,p(\Sigma)\,V^\top$ with
# $p(\sigma) = a\sigma + b\sigma^3 + c\sigma^5$. So if we first scale $G$ so that every singular
# value lies in $[0, 1]$ (dividing by the Frobenius norm does it, since
# $\|G\|_F \geq \|G\|_2$), then apply a polynomial $p$ that maps $[0, 1]$ close to 1 a few times,
# we get close to $U V^\top$. Only matrix products are needed.
#
# The classical choice $(a, b, c) = (1.5, -0.5, 0)$ converges to exactly 1, but slowly when
# $\sigma$ is small, where $p(\sigma) \approx 1.5\sigma$. Keller Jordan chose
# $(3.4445, -4.7750, 2.0315)$: a slope of 3.4 at zero lifts small singular values fast, at the
# price of not converging exactly. After five steps every singular value above about a
# thousandth of the Frobenius norm lies in a band around 1, which works as well as exact
# orthogonalisation in practice. `singular_value_map` in
# [`muongrid/newton_schulz.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/newton_schulz.py) applies the polynomial to numbers; `zeropower_ns5` applies it to a
# matrix. {numref}`fig-ch1-nsmap` draws both polynomials: **move its slider** to change the
# number of steps (every position was computed when the page was built, so it works here).

# %% mystnb={"figure": {"name": "fig-ch1-nsmap", "caption": "What $k$ steps of Newton-Schulz do to a singular value in $[0, 1]$: the classical cubic (blue) and Keller Jordan's quintic (red). The slider sets $k$; the title gives the band into which the quintic maps $[0.001, 1]$; the cell prints it for five steps."}}
from muongrid.lab.explorers import Figure, ns_map_explorer
from muongrid.newton_schulz import NS_COEFFICIENTS, singular_value_map

sigma = torch.linspace(0, 1, 501)
NS_MAP_STEPS = 12  # the slider's last position: far enough for exercise 1's cubic
show(Figure(ns_map_explorer(max_steps=NS_MAP_STEPS)))
band = singular_value_map(torch.linspace(1e-3, 1, 1000))
print(
    f"after 5 quintic steps, singular values in [0.001, 1] land in [{band.min():.3f}, "
    f"{band.max():.3f}]"
)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
keep("ch1-band-lo", f"{band.min():.3f}")
keep("ch1-band-hi", f"{band.max():.3f}")

# %% [markdown]
# ### Explore the coefficients
#
# {numref}`fig-ch1-coefficients` keeps Jordan's $a$ and $b$ and moves $c$ (in Jupyter,
# `ns_coefficient_explorer(cs=...)` takes other values). With $c = 0$ the map blows up: the
# quintic term allows a steep start without overshooting wildly. The dashed curve is 3 steps:
# small singular values are not yet lifted.

# %% mystnb={"figure": {"name": "fig-ch1-coefficients", "caption": "The map after 3 (dashed) and 5 (solid) steps of $p(x) = ax + bx^3 + cx^5$ with Jordan's $a$ and $b$, for the quintic coefficient $c$ on the slider; the title says where 5 steps send $[0.001, 1]$."}}
from muongrid.lab.explorers import ns_coefficient_explorer

show(Figure(ns_coefficient_explorer()))

# %% [markdown]
# ### NS5 on the real gradient

# %%
from muongrid.newton_schulz import ns5_flops, zeropower_ns5

U, S, Vh = torch.linalg.svd(G, full_matrices=False)
exact = U @ Vh
O = zeropower_ns5(G).float()
s_after = torch.linalg.svdvals(O)
cosine = (O * exact).sum() / (O.norm() * exact.norm())
print(
    f"singular values after NS5: min {s_after.min():.3f}, max {s_after.max():.3f} "
    f"(before: "
    f"{s.min():.2e} to {s.max():.2e})"
)
print(f"cosine similarity of NS5 output with the exact U V^T: {cosine:.4f}")
n_below = int((s < 1e-3 * G.norm()).sum())


def best_time(fn, repeats=5):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


t_ns, t_svd = best_time(lambda: zeropower_ns5(G)), best_time(
    lambda: torch.linalg.svd(G, full_matrices=False)
)
print(
    f"NS5: {ns5_flops(*G.shape) / 1e6:.0f} MFLOP, {t_ns * 1e3:.2f} ms; SVD: "
    f"{t_svd * 1e3:.2f} ms (this CPU)"
)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
# The claims above: one (and only one) null direction, the all-ones vector
# (LayerNorm centring), which NS5 in bf16 lifts well above zero but below the band.
assert (
    s[-1] < 1e-6 * s[0] < s[-2]
), "expected exactly one singular value that is zero up to rounding"
assert (
    Vh[-1].abs() * G.shape[1] ** 0.5 - 1
).abs().max() < 1e-3, "the null direction is not the all-ones vector"
assert (
    0.01 < s_after.min() < band.min()
), "NS5 should lift the null direction above zero but not into the band"
assert n_below == int(
    (s_after < band.min()).sum()
), "the values below the band should be those that started below it"
keep("ch1-n-below", n_below)
keep("ch1-s-null", f"{s[-1]:.2e}")
keep("ch1-s-max", f"{s[0]:.2e}")
keep("ch1-s-null-after", f"{s_after.min():.3f}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
Five steps on the gradient from above, in bf16 as Muon does, against the exact $U V^\top$
from an SVD. One singular value is zero up to rounding ({{ch1-s-null}}, against
{{ch1-s-max}} for the largest): `fc` reads a LayerNorm's output, whose features sum to zero
(at initialisation), so the gradient sends the all-ones direction to zero. Exact arithmetic
would keep it there ($p(0) = 0$), but bf16 rounding gives it a tiny value that the quintic lifts
to {{ch1-s-null-after}}. The map applies to singular value / Frobenius norm: the
{{ch1-n-below}} singular values below $10^{-3}$ of the norm (the null one included) come out
below the band, between {{ch1-s-null-after}} and {{ch1-band-lo}}; the rest land in it.
""")

# %% [markdown]
# On a CPU a small SVD is cheap too; NS5 pays on GPUs, where bf16 matrix products run at tens to
# hundreds of TFLOP/s and an SVD is sequential.
# NS5 costs $5\,(4m^2n + 2m^3)$ FLOPs for an $m \times n$ matrix with $m \le n$
# (`ns5_flops`; a test checks it against PyTorch's own FLOP counter).
#
# ## The whole Muon step
#
# For each weight matrix $W$ of shape $A \times B$, with gradient $G_t$ (the math is in
# [`muongrid/updates.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/updates.py), one small function per line below):
#
# $$
# \begin{aligned}
# M_t &= \mu M_{t-1} + (1-\mu)\, G_t\\
# N_t &= (1-\mu)\, G_t + \mu M_t\\
# O_t &= \mathrm{NS5}(N_t)\\
# W_t &= (1 - \eta\lambda)\, W_{t-1}\\
#     &\quad - \eta \cdot 0.2\sqrt{\max(A, B)}\; O_t
# \end{aligned}
# $$
#
# - $M_t$ is the momentum, an exponential moving average (EMA) of the gradients, with
#   $\mu = 0.95$ (the default of `muongrid.Muon` and of `torch.optim.Muon`).
# - $N_t$ is the Nesterov look-ahead: the gradient blended once more with the new momentum.
# - $O_t$ is $N_t$ orthogonalised by NS5, in bf16.
# - $W_t$ is the new weight: $\eta$ is the learning rate, $(1 - \eta\lambda)$ decoupled weight
#   decay as in AdamW.
#
# Moonshot writes the momentum as a plain sum, $M_t = \mu M_{t-1} + G_t$: the EMA times
# $1/(1-\mu)$, a scale NS5 divides away, so both give the same update up to bf16 rounding (a test
# in [`tests/test_math.py`](https://github.com/muongrid-book/distributed-muon/blob/main/tests/test_math.py) checks it). The EMA form lets our Muon match `torch.optim.Muon`
# {cite:p}`pytorch2025muon` bit for bit.
#
# The factor $0.2\sqrt{\max(A, B)}$ is Moonshot's "match RMS" adjustment
# {cite:p}`liu2025muonscalable`: an exactly orthogonal $A \times B$ matrix has RMS entry
# $1/\sqrt{\max(A, B)}$, so scaled it has RMS 0.2, like AdamW's update, and AdamW's learning rate
# and weight decay are a sound start ({doc}`chapter 9 <09_training>` tunes from there). NS5's
# output is only roughly orthogonal, so its RMS comes out somewhat below 0.2. Measured on our
# gradients:

# %%
from muongrid.updates import adjust_lr

rms_seen = []
for name, p in [
    ("blocks.0.fc.weight", model.blocks[0].fc.weight),
    ("blocks.0.qkv.weight", model.blocks[0].qkv.weight),
]:
    O = zeropower_ns5(p.grad).float()
    scale = adjust_lr(1.0, tuple(p.shape), "match_rms_adamw")
    rms = (O * scale).pow(2).mean().sqrt().item()
    print(f"{name} {tuple(p.shape)}: RMS of the scaled update = {rms:.3f}")
    rms_seen.append(rms)

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
assert all(0.1 < rms <= 0.2 * 1.2 for rms in rms_seen), "the RMS should be near (below) 0.2"
keep("ch1-rms", " and ".join(f"{rms:.3f}" for rms in rms_seen))

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
The scaled updates have RMS {{ch1-rms}}: the same order as AdamW's, a little below the
0.2 of an exactly orthogonal matrix.
""")

# %% [markdown]
# ## The hybrid: Muon where it belongs, AdamW elsewhere
#
# Muon is for the matrices of hidden layers. Biases and norm gains are vectors, with no
# singular values to equalise. Embedding tables are lookups: orthogonalising the whole table
# mixes rows whose tokens never appeared. The output head's rows are per-class. The hybrid,
# called MuonW here, routes each parameter by what it is ([`muongrid/routing.py`](https://github.com/muongrid-book/distributed-muon/blob/main/scripts/muongrid/routing.py)): embeddings,
# the output head and vectors go to AdamW; every other matrix goes to Muon.
# `routing_table(model)` prints each route with its reason; `hybrid_param_groups(model)` makes
# the two parameter groups. For our model:

# %%
from muongrid.optim import hybrid_param_groups
from muongrid.routing import routing_table

routes = routing_table(model)
print(routes)
counts = {k: sum(math.prod(r.shape) for r in routes if r.optimizer == k)
          for k in ("Muon", "AdamW")}
print(f"\nparameters optimised by Muon: {counts['Muon']:,}; "
      f"by AdamW: {counts['AdamW']:,}")

# %% [markdown]
# ## Muon vs AdamW on a real task
#
# We train the tiny GPT twice from the same initialisation on the same batches: AdamW on every
# parameter, then MuonW, both with $\eta = 3 \times 10^{-3}$ and $\lambda = 0.1$ (what the RMS
# matching allows). One seed at one learning rate is an illustration, not a benchmark;
# {doc}`chapter 9 <09_training>` makes it one (tuned learning rates, several seeds, equal tokens).

# %%
from muongrid.lab.charlm import train
from muongrid.optim import AdamW, MuonW

STEPS, LR, WD = 100, 3e-3, 0.1
histories = {}
for kind in ("AdamW", "MuonW"):
    torch.manual_seed(0)
    net = TinyGPT(data["vocab_size"])
    if kind == "AdamW":
        opt = AdamW(net.parameters(), lr=LR, weight_decay=WD, betas=(0.9, 0.95))
    else:
        opt = MuonW(hybrid_param_groups(net, muon=dict(lr=LR, weight_decay=WD),
                                        adamw=dict(lr=LR, weight_decay=WD,
                                                   betas=(0.9, 0.95))))
    histories[kind] = train(net, opt, data, steps=STEPS)
    h = histories[kind]
    print(
        f"{kind}: validation loss {h['val_loss'][-1]:.3f} nats/char after {STEPS} "
        f"steps, "
        f"{h['seconds'] / STEPS * 1e3:.0f} ms per step"
    )

# %% tags=["hide-input"] mystnb={"figure": {"name": "fig-ch1-training", "caption": "The tiny GPT trained with AdamW and with MuonW from the same initialisation on the same batches: training loss (top, 20-step mean) and validation loss (bottom)."}} jupyter={"source_hidden": true}
fig, axes = plt.subplots(2, 1, figsize=(6.4, 6.4), sharex=True)
for kind, h in histories.items():
    smooth = torch.tensor(h["step_loss"]).unfold(0, 20, 1).mean(1)
    color = palette.OPTIMIZER["muon" if kind == "MuonW" else "adamw"]
    axes[0].plot(range(20, STEPS + 1), smooth, label=kind, color=color)
    axes[1].plot(h["val_steps"], h["val_loss"], marker="o", label=kind, color=color)
axes[0].set(title="training loss (20-step mean)", ylabel="nats per character")
axes[1].set(title="validation loss", xlabel="step", ylabel="nats per character")
for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend()
fig.tight_layout()
show(fig)
plt.close(fig)

adamw_val, muonw_val = (
    histories["AdamW"]["val_loss"][-1],
    histories["MuonW"]["val_loss"][-1],
)
time_ratio = histories["MuonW"]["seconds"] / histories["AdamW"]["seconds"]
ms = {k: round(h["seconds"] / STEPS * 1e3) for k, h in histories.items()}

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Kept for the prose and checked for the book (folded in Jupyter and Colab).
keep("ch1-better", "MuonW" if muonw_val < adamw_val else "AdamW")
# The gap and the ratio from the rounded figures printed above, so that they agree
# with them.
keep("ch1-gap", f"{abs(round(adamw_val, 3) - round(muonw_val, 3)):.3f}")
keep("ch1-time-ratio", f"{ms['MuonW'] / ms['AdamW']:.2f}")
keep("ch1-ms", f"{ms['MuonW']} ms against {ms['AdamW']} ms")
keep("ch1-time-word", "longer" if time_ratio > 1 else "shorter")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
In this run (one seed, {numref}`fig-ch1-training`) {{ch1-better}} ended lower, by
{{ch1-gap}} nats per character. MuonW's steps took {{ch1-time-ratio}} times as
long as AdamW's ({{ch1-ms}} per step on this machine, forward and backward included).
""")

# %% [markdown]
# In this tiny model the forward pass is cheap, so Newton-Schulz is a large share of the step; in
# an LLM the forward and backward passes grow with the batch while NS5 does not, which is why
# Moonshot measured the optimizer at 1-3% of the step.
#
# ## Agreement with `torch.optim.Muon`
#
# PyTorch ships its own Muon (since 2.9). Ours is written independently with the same
# conventions, so both must produce the same parameters:

# %%
from muongrid.newton_schulz import native_bf16_matmul
from muongrid.optim import Muon

if not hasattr(torch.optim, "Muon"):
    print(
        f"torch {torch.__version__} has no torch.optim.Muon (added in 2.9); skipping "
        f"the comparison"
    )
else:
    gen = torch.Generator().manual_seed(1)
    p0 = torch.randn(124, 324, generator=gen)
    ours, theirs = torch.nn.Parameter(p0.clone()), torch.nn.Parameter(p0.clone())
    opt_ours = Muon([ours], lr=0.02, weight_decay=0.1, adjust_lr="match_rms_adamw")
    opt_theirs = torch.optim.Muon(
        [theirs], lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw"
    )
    for _ in range(5):
        g = torch.randn(124, 324, generator=gen)
        ours.grad, theirs.grad = g.clone(), g.clone()
        opt_ours.step()
        opt_theirs.step()
    diff = (ours - theirs).abs().max().item()
    moved = (ours - p0).abs().max().item()
    print(
        f"after 5 steps: max |ours - torch| = {diff:.2e}, while the parameters moved "
        f"by up to {moved:.2e}"
    )
    print(
        "bf16 matmul path here:",
        (
            "native, so the kernels are the same and the difference must be 0"
            if native_bf16_matmul(torch.device("cpu"))
            else "emulated in fp32 (no fast bf16 on this CPU), so single elements may "
                 "differ by a bf16 ulp"
        ),
    )

# %% [markdown]
# ## Summary
#
# - Muon replaces the momentum update by its orthogonalisation $UV^\top$, equalising the few
#   dominant directions of a gradient.
# - NS5 does that with matrix products only: five steps of an odd quintic.
# - The step: EMA momentum, Nesterov, NS5 in bf16, lr scaled by $0.2\sqrt{\max(A,B)}$,
#   decoupled weight decay.
# - MuonW gives Muon the hidden matrices and AdamW the rest.
#
# All of it ran in one process. Chapter 2 maps what changes over many.
#
# ## Exercises
#
# 1. The blue curve of {numref}`fig-ch1-nsmap` is the classical cubic, $(a, b, c) = (1.5, -0.5, 0)$.
#    Move the slider and hover over that curve at $\sigma = 0.01$ (or, in a cell, call
#    `singular_value_map(torch.tensor([0.01]), k, (1.5, -0.5, 0))` for growing `k`): how many steps
#    does the cubic need to bring a singular value of 0.01 above 0.5?
# 2. Repeat the training comparison with three seeds and learning rates `1e-3, 3e-3, 1e-2` for
#    both optimizers. Is the difference larger than the spread across seeds?
# 3. Give the embedding table to Muon (move it from the AdamW group of `hybrid_param_groups(net)` to
#    the Muon group) and retrain. What happens to the validation loss?
# 4. Use `adjust_lr="original"` instead of `"match_rms_adamw"`. Why does MuonW now need a
#    different learning rate than AdamW?
# 5. Llama-3-8B's MLP matrices are 14336 x 4096. Count by hand the FLOPs of five Newton-Schulz
#    steps on one of them (a multiply-add is 2 FLOPs; a step forms $A = XX^\top$, then
#    $B = bA + cA^2$, then $aX + BX$, with $X$ turned so that its short side comes first), and compare them with the matrix's own forward and backward FLOPs on a batch of
#    4 Mi tokens (6 x its parameters x the tokens).

# %% tags=["remove-cell"] jupyter={"source_hidden": true}
# Exercises 1 and 5: the answers, computed and checked (the solutions below quote them).
from torch.utils.flop_counter import FlopCounterMode

steps = next(k for k in range(1, 50)
             if float(singular_value_map(torch.tensor([0.01]), k, (1.5, -0.5, 0))) > 0.5)
cubic = [float(singular_value_map(torch.tensor([0.01]), k, (1.5, -0.5, 0)))
         for k in (steps - 1, steps)]
assert steps <= NS_MAP_STEPS, "the explorer's slider must reach exercise 1's answer"
keep("ch1-ex1-steps", steps)
keep("ch1-ex1-before", steps - 1)
keep("ch1-ex1-low", f"{cubic[0]:.3f}")
keep("ch1-ex1-high", f"{cubic[1]:.3f}")

rows, cols, tokens = 14336, 4096, 4 * 2**20
m, n = min(rows, cols), max(rows, cols)
by_hand = 5 * (2 * m * m * n + 2 * m * m * m + 2 * m * m * n)  # X X^T, A A, B X
with FlopCounterMode(display=False) as counter:  # torch counts the real function's matmuls
    zeropower_ns5(torch.empty(rows, cols, device="meta"))
assert counter.get_total_flops() == by_hand == ns5_flops(rows, cols)
train_flops = 6 * rows * cols * tokens
table_shape = tuple(model.embed["tok"].weight.shape)
moved = math.prod(table_shape)
keep("ch1-ex3-shape", " x ".join(map(str, table_shape)))
keep("ch1-ex3-share", f"{moved / (counts['Muon'] + moved):.0%}")
keep("ch1-ex3-flops", f"{ns5_flops(*table_shape) / 1e6:.1f}")
keep("ch1-ex5-tflops", f"{by_hand / 1e12:.2f}")
keep("ch1-ex5-train", f"{train_flops / 1e15:.2f}")
keep("ch1-ex5-share", f"{by_hand / train_flops:.2%}")

# %% tags=["remove-input"] jupyter={"source_hidden": true}
say(r"""
:::{admonition} Solutions
:class: dropdown

1. Iterate $p(\sigma) = 1.5\sigma - 0.5\sigma^3$ from $\sigma = 0.01$ (the slider of
   {numref}`fig-ch1-nsmap` does it for each `k`; so does
   `singular_value_map(torch.tensor([0.01]), k, (1.5, -0.5, 0))`). The answer is
   **{{ch1-ex1-steps}} steps**: after {{ch1-ex1-before}} the value is {{ch1-ex1-low}}, after
   {{ch1-ex1-steps}} it is {{ch1-ex1-high}}. Near zero each step multiplies by about 1.5, so it
   takes about $\log(50)/\log(1.5) \approx 10$ steps: twice the quintic's five.
2. Run the training cell in a loop over seeds and learning rates; it prints each run's
   `validation loss ... after N steps`. Compare the spread of the final validation losses within one
   optimizer with the gap between the two: the difference counts only if it exceeds the
   seed-to-seed spread. The answer is that loop's output, not a number this page can state; the
   same question, with tuned learning rates, several seeds and equal tokens, is answered for a
   recorded run in {doc}`chapter 9 <09_training>` (the sentence under its study figure says whether
   the seeds' final losses overlap).
3. The routing recognises the embedding by its module (an `nn.Embedding`, whatever its name), so
   it has to be moved by hand: `groups[1]` holds it (the Muon group comes first). Muon then
   orthogonalises the whole table as one matrix, although its rows are separate lookups, one per
   character: a {{ch1-ex3-shape}} table, {{ch1-ex3-share}} of the parameters Muon then holds,
   and one more Newton-Schulz run per step ({{ch1-ex3-flops}} MFLOP). The training cell prints the
   new run's `validation loss ... after N steps`; compare it with the run above (one seed, so
   compare it with the seed-to-seed spread of exercise 2 before calling it a change).
4. `"original"` scales the step by $\sqrt{\max(1, A/B)}$, so the update's RMS is about
   $1/\sqrt{\max(A,B)}$ times that, far from AdamW's 0.2: the same learning rate would then mean a
   much smaller step for the Muon matrices than for the AdamW ones.
5. With $m = 4096$ (the short side) and $n = 14336$, a step computes $A = XX^\top$ ($2m^2n$),
   $A^2$ ($2m^3$) and $BX$ ($2m^2n$): five steps are $5(4m^2n + 2m^3)$ =
   **{{ch1-ex5-tflops}} TFLOP**. Forward and backward on 4 Mi tokens cost
   {{ch1-ex5-train}} PFLOP, so Newton-Schulz adds {{ch1-ex5-share}} of the matrix's own
   work. (The build counts the FLOPs of `zeropower_ns5` itself with torch's `FlopCounterMode` on
   the meta device and checks they equal the hand count and `ns5_flops`.) The share grows as the
   batch shrinks: chapter 13 does this for whole models and grids.
:::
""")
