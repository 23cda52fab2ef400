"""Reading DTensor parameters: which dimension a tensor-parallel model split, and the local shard.

A model made tensor-parallel with ``torch.distributed.tensor.parallel.parallelize_module`` holds
its split weights as DTensors on the grid's "tp" mesh dimension. ``ColwiseParallel`` gives a
``nn.Linear`` weight ``Shard(0)`` (its output rows are split), ``RowwiseParallel`` gives it
``Shard(1)`` (its input columns are split); a weight left alone is a plain tensor (or a
``Replicate()`` DTensor), the same on every TP rank. The ZeRO-1 plan only needs that one number
per parameter, the ``tp_split_dim``::

    Shard(0) -> 0      Shard(1) -> 1      Replicate() -> -1      a plain tensor -> -1 (or what the group says)

and the optimizer works on ``to_local()`` of each parameter and gradient (the TP shard this rank
holds, which aliases the DTensor's storage, so writing into it updates the parameter).

What is refused, with an error naming the parameter: a DTensor on a mesh that is not the grid's
(other ranks, or a mesh dimension that is neither "dp" nor "tp"), a ``Partial()`` placement (an
unreduced sum is not a parameter), a shard over "dp" (that is FSDP, which keeps its own shards of
the parameters; ZeRO-1 here keeps whole TP shards on every DP rank), a TP size other than the
grid's, a split that does not divide evenly, and a ``tp_split_dims`` entry that contradicts the
placement.
"""
from __future__ import annotations

import sys

import torch


def is_dtensor(t) -> bool:
    """Whether ``t`` is a DTensor. Only once something has imported ``torch.distributed.tensor`` can one
    exist, so this never imports it (that import costs each process about a second of CPU)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: ``to_local()`` of a DTensor (a view of its storage), else ``t``."""
    return t.to_local() if is_dtensor(t) else t


def _placement_dim(name: str, placement, ndim: int, mesh_dim: str) -> int:
    """-1 for Replicate, d for Shard(d) (negative dims normalised); an error for anything else."""
    from torch.distributed.tensor import Replicate, Shard
    if type(placement) is Replicate:
        return -1
    if type(placement) is Shard:
        return placement.dim % ndim
    raise ValueError(f"parameter {name!r}: placement {placement} on mesh dimension {mesh_dim!r} is not supported; "
                     "a parameter must be Shard(d) or Replicate() on 'tp' (a Partial placement is an unreduced "
                     "sum, not a parameter)")


def tp_split_dim_of(name: str, param: torch.Tensor, grid) -> int | None:
    """The TP split dim a DTensor ``param`` carries (checked against ``grid``), or None for a plain tensor."""
    if not is_dtensor(param):
        return None
    mesh = param.device_mesh
    names = mesh.mesh_dim_names or ()
    if len(names) != mesh.ndim or any(n not in ("dp", "tp") for n in names):
        raise ValueError(f"parameter {name!r} is a DTensor on a mesh with dimensions {names or '(unnamed)'}; "
                         "the optimizer reads DTensors on the grid's mesh, whose dimensions are named 'dp' and 'tp' "
                         "(use grid.mesh['tp'] with parallelize_module)")
    dims = {}
    for mesh_dim, placement in zip(names, param.placements):
        dims[mesh_dim] = _placement_dim(name, placement, param.ndim, mesh_dim)
    if dims.get("dp", -1) != -1:
        raise ValueError(f"parameter {name!r} is sharded over the 'dp' mesh dimension ({param.placements}): that "
                         "is FSDP (each DP rank keeps a part of the parameter), which this ZeRO-1 optimizer does "
                         "not handle; keep parameters whole over 'dp' (Replicate) and shard them over 'tp' only")
    if "tp" in names:
        size = mesh.size(names.index("tp"))
        if size != grid.tp:
            raise ValueError(f"parameter {name!r} is a DTensor on a 'tp' mesh dimension of size {size}, but the "
                             f"grid has tp={grid.tp}")
        ranks = _tp_ranks(mesh, names)
        if grid.tp > 1 and ranks != _grid_tp_ranks(grid):
            raise ValueError(f"parameter {name!r} lives on the TP ranks {ranks}, but this rank's TP group is "
                             f"{_grid_tp_ranks(grid)}: build the model on grid.mesh['tp']")
    split = dims.get("tp", -1)
    full, mine = tuple(param.shape), tuple(param.to_local().shape)
    if split != -1 and full[split] % grid.tp:
        raise ValueError(f"parameter {name!r} of shape {full}: dimension {split} has size {full[split]}, which "
                         f"does not divide by tp={grid.tp} (the shards are uneven); choose a size that divides")
    expected = tuple(s // grid.tp if d == split else s for d, s in enumerate(full))
    if mine != expected:
        raise ValueError(f"parameter {name!r}: local shard of shape {mine}, expected {expected} for {full} "
                         f"split on dim {split} over tp={grid.tp}")
    return split


def _tp_ranks(mesh, names) -> list[int]:
    """The global ranks of this rank's row of the mesh along "tp"."""
    coords = mesh.get_coordinate()
    grid_ranks = mesh.mesh
    if len(names) == 2:
        row = coords[names.index("dp")]
        grid_ranks = grid_ranks[row] if names.index("dp") == 0 else grid_ranks[:, row]
    return [int(r) for r in grid_ranks.reshape(-1)]


def _grid_tp_ranks(grid) -> list[int]:
    return [grid.dp_rank * grid.tp + t for t in range(grid.tp)]


def resolve_tp_split_dims(names: list[str], params: list[torch.Tensor], given: list[int] | None, grid) -> list[int]:
    """Each parameter's TP split dim: from its placement if it is a DTensor (an entry in ``given`` must then
    agree), else from ``given`` (default -1, replicated)."""
    given = list(given) if given else [None] * len(params)
    if len(given) != len(params):
        raise ValueError(f"{len(given)} tp_split_dims for {len(params)} parameters")
    out = []
    for name, p, want in zip(names, params, given):
        got = tp_split_dim_of(name, p, grid)
        if got is None:
            out.append(-1 if want is None else int(want))
            continue
        if want is not None and int(want) != got:
            raise ValueError(f"parameter {name!r}: tp_split_dims says {want}, but its DTensor placement "
                             f"{p.placements} says {got}; leave tp_split_dims out for DTensor parameters")
        out.append(got)
    return out
