"""muongrid: Distributed Muon (ZeRO-1 x tensor parallel) as torch.optim.Optimizers, tested against one process.

    pip install -e .            # from a checkout (make setup does it)

    from muongrid import DistributedMuon, Grid, hybrid_param_groups
    grid = Grid.build(dp=2, tp=2)                          # after torch.distributed.init_process_group
    opt = DistributedMuon(hybrid_param_groups(model), grid, layout="owner")

The engine, in the order the book introduces it (the math apart from the orchestration):

    newton_schulz  NS5 orthogonalisation and its FLOP count (pure functions)
    updates        Muon momentum, lr adjustment, decoupled decay, AdamW (pure, elementwise)
    optim          single-device Muon / AdamW / hybrid MuonW and the hybrid's parameter groups
    routing        which parameter gets Muon or AdamW, decided by its module and shape, and why (the table)
    grid           the DP x TP grid: rank layout and process groups
    layouts        where ZeRO-1 cuts buckets and who orthogonalises each matrix (pure)
    hardware       hardware profiles (h100(), profile(...)) that size the group layout's groups by time
    plan           the ZeRO-1 plan: virtual buffers, buckets, padding, dist_meta, owners (pure)
    sharding       moving tensors by the plan: TP shard/unshard, pack/unpack buckets
    placements     DTensor placements -> tp_split_dim, and a DTensor's local shard
    store          the step's store: each bucket's parameters, gradients, master shard and state as flat buffers
    reducer        grad_reduce="backward": each bucket's gradient reduce-scatter launched from backward, in one order
    comm           every collective, with the communication ledger (bytes and Newton-Schulz work)
    ledger         reading the ledger (summary, table, peers) and Comm's calls outside the step (setup, reports)
    flows          momentum pieces -> orthogonalised pieces: FlowOptions, the bucket layout's flow
    owner_flow     the owner layouts' flow (owner, aligned, group): pieces to owners and back, K all-to-alls each way
    ns_group       one matrix's Newton-Schulz over a group of ranks (the Gram all-reduce form, or the row form)
    owner_routes   the owner layouts' routes: each all-to-all's pieces, per matrix and rank, made with the plan (pure)
    group_routes   the group layout: which elements of each rank's pieces go to which member (pure)
    group_flow     the group layout's part of the owner flow: a grouped matrix's route and its Newton-Schulz
    ns_gram_group  the Gram form (ns_form="gram") of one matrix over a group: R all-reduced once (pure)
    ns_variants    Newton-Schulz variants: per-iteration coefficient schedules and the Gram form (pure)
    distributed    DistributedMuon and DistributedAdamW (torch.optim.Optimizer subclasses): the one optimizer class
    step           one step as a value (Step: its decision, gradient pieces, matrices orthogonalised) and step counts
    options        what the optimizers are built with: layout defaults, the checks made once when one is built
    rank_state     one rank's state: binding its views, state_bytes, state_dict / load_state_dict (functions)
    contract       what every torch optimizer promises in a step (checks, skipped gradients, schedulers)
    capture        capturable=True: hyperparameters and step counts as device tensors, what a captured step refuses
    clipping       clip_grad_norm_'s arithmetic: the DP-mean gradient's global norm, TP counted once
    launch         one entry point for local gloo processes and torchrun
    devices        a rank's device (cuda:{LOCAL_RANK % visible GPUs}), device-inclusive clocks, CUDA-event spans
    finite         the gradients' NaN/Inf check: raised on every rank together, or the step skipped
    qk_clip        MuonClip: query and key rows rescaled after each update, on ZeRO-1 or FSDP2 shards
    checkpoint     DCP checkpoints in global coordinates: save on one grid and layout, load on any
    shard_files    every rank's own shard to one folder and back, bit for bit (the same world): for trainers
    hf             HF Trainer: ShardedCheckpoint saves and resumes every rank's shard (imports transformers when used)
    accelerate     Accelerate: ShardedState adds every rank's shard to save_state / load_state (hooks; no import)
    lightning      Lightning Trainer and Fabric: DDP strategies that keep every rank's shard (import it when used)
    tp_plans       tensor-parallel plans for models people bring (a Hugging Face Llama), for parallelize_module
    data           the rows each rank reads: a DataLoader keyed by the DP rank, its position saved and resumed
    resume         train.py's --save/--resume: model, optimizer, scheduler, data position, RNG
    fsdp_routes    FSDP2: which rank owns each matrix and where its row blocks travel (pure)
    fsdp           FSDPMuon: Muon for fully_shard models, each matrix orthogonalised once by its owner
    checkpoint_fsdp  what a checkpoint holds for an FSDPMuon: its DTensors, as FSDP2 places them
    verify, bench  the checks the README advertises, runnable from an install: python -m muongrid.verify
    requires       the torch this needs, checked on import

``muongrid.lab`` holds what the book, benchmarks and tests use beside it (synthetic problems, the
cost model, traces, the tiny GPT, the proof of concept's bugs). The command-line entry points live
one folder up: ``python scripts/verify.py --dp 2 --tp 2 --layout bucket,owner``.
"""
__version__ = "0.5.0"  # the one place the version is written: pyproject.toml reads it from here

from .requires import check_torch as _check_torch

_check_torch()  # on too old a torch, stop here with a message that names the version and the missing APIs

from .distributed import DistributedAdamW, DistributedMuon
from .fsdp import FSDPMuon
from .grid import Grid, grid_layout
from .layouts import LAYOUTS
from .newton_schulz import ns5_flops, zeropower_ns5
from .optim import AdamW, Muon, MuonW, hybrid_param_groups, routes_to_muon
from .routing import routing_table
from .plan import DistMeta, ParamSpec, build_plan

__all__ = ["LAYOUTS", "AdamW", "DistMeta", "DistributedAdamW", "DistributedMuon", "FSDPMuon", "Grid", "Muon", "MuonW",
           "ParamSpec", "build_plan", "grid_layout", "hybrid_param_groups", "ns5_flops", "routes_to_muon",
           "routing_table", "zeropower_ns5"]
