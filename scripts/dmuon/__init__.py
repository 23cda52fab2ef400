"""dmuon: Distributed Muon (ZeRO-1 x tensor parallel), small enough to read and tested against one process.

The modules, in the order the book introduces them:

    newton_schulz  NS5 orthogonalisation and its FLOP count (pure functions)
    updates        Muon momentum, lr adjustment, decoupled decay, AdamW (pure, elementwise)
    optim          single-device Muon / AdamW / hybrid MuonW and the hybrid routing rule
    grid           the DP x TP grid: rank layout and process groups
    plan           the ZeRO-1 plan: virtual buffers, buckets, padding, dist_meta
    sharding       moving tensors by the plan: TP shard/unshard, pack/unpack buckets
    comm           every collective, with the communication ledger
    distributed    DistributedMuon and DistributedAdamW (the Moonshot flow)
    launch         one entry point for local gloo processes and torchrun
    synthetic      seeded problems for verification and benchmarks

The command-line entry points live one folder up: ``python scripts/verify.py --dp 2 --tp 2``.
"""
from .distributed import DistributedAdamW, DistributedMuon
from .grid import Grid, grid_layout
from .newton_schulz import ns5_flops, zeropower_ns5
from .optim import AdamW, Muon, MuonW, hybrid_param_groups, routes_to_muon
from .plan import DistMeta, ParamSpec, build_plan

__all__ = ["AdamW", "DistMeta", "DistributedAdamW", "DistributedMuon", "Grid", "Muon", "MuonW", "ParamSpec",
           "build_plan", "grid_layout", "hybrid_param_groups", "ns5_flops", "routes_to_muon", "zeropower_ns5"]
