"""The ZeRO-1 plan: where every parameter lives in a virtual flat buffer and which DP rank owns which part.

Pure geometry, no tensors and no processes, so the book can draw the plan of any grid.

Per parameter group (``group_idx``) the TP-local parameters are laid end to end, in order,
in one *virtual* flat buffer (nothing is allocated for it). The buffer is cut into buckets
(``bucket_idx``) on parameter boundaries: a bucket is the unit of one collective. Each bucket
is cut into ``dp`` shards at ``cuts`` (equal shards, cut anywhere, except under the "aligned"
layout, which cuts between matrices: see ``layouts.py``); DP rank ``r`` owns shard ``r`` of every
bucket and keeps optimizer state only for it (ZeRO-1). In a collective every shard travels padded
to ``shard_numel`` elements, so a bucket occupies ``padded_numel = dp * shard_numel`` elements.
``global_buffer_size`` is the padded length of the whole buffer.

Per parameter, ``DistMeta`` (the proof of concept's ``dist_meta``) says:

* ``shape``: the TP-local shape, what this rank holds and what the buffer stores;
* ``full_shape``: the whole matrix after the TP gather (what Newton-Schulz and ``adjust_lr`` see);
* ``global_range``: [start, end) of the parameter in the buffer;
* ``local_range``: the part of ``global_range`` inside this DP rank's shard of the bucket
  (empty, ``start == end``, when the rank owns none of it); a parameter that *straddles* a
  shard boundary is owned piecewise by several DP ranks, which is normal;
* ``tp_split_dim``: the dimension split over TP (0: rows, 1: columns), or -1 if replicated.

``Plan.piece_slice(meta, d)`` gives the same for any DP rank ``d`` (every rank can compute every
other rank's pieces), and ``Plan.owners`` the rank that orthogonalises each Muon matrix under the
"owner" and "aligned" layouts. Under "group", ``Plan.groups`` gives the ranks that orthogonalise a
matrix together (those above the fair share of Newton-Schulz FLOPs) and ``owners`` the others.

    >>> plan = build_plan([[ParamSpec("w", (100, 100), 0)]], dp=3, dp_rank=1, tp=2)
    >>> plan.metas[0][0]
"""
from __future__ import annotations

import bisect
import math
import operator
from dataclasses import dataclass, field

from .hardware import check_hw
from .layouts import EvenCuts, HeldRuns, Matrix, aligned_cuts, assign_owners, assign_owners_and_groups, check_layout
from .newton_schulz import ns5_flops

DEFAULT_BUCKET_NUMEL = 2**20  # 4 MiB of fp32 per bucket, up to 4 DP ranks ("auto" grows it beyond: bucket_limit)
SHARD_NUMEL = 2**18           # "auto": each rank's shard of a bucket holds at least this many elements (1 MiB fp32)


def bucket_limit(bucket_numel: int | str | None, dp: int, aligned: bool = False) -> int | None:
    """The most elements a bucket holds. ``bucket_numel`` as given (None: one bucket per group), or "auto":
    ``DEFAULT_BUCKET_NUMEL``, grown with ``dp`` so that each rank's shard keeps ``SHARD_NUMEL`` elements (at 1,024
    DP ranks a 2^20-element bucket would cut 4 KiB shards, and a reduce-scatter or all-gather per bucket would pay
    its latency for almost no bytes; Megatron-LM grows its buckets with DP for the same reason). Aligned shards
    hold whole matrices, so an aligned bucket holds ``dp`` times as many elements (each shard is then about the
    limit), "auto" meaning ``DEFAULT_BUCKET_NUMEL`` there."""
    if bucket_numel == "auto":
        bucket_numel = DEFAULT_BUCKET_NUMEL if aligned else max(DEFAULT_BUCKET_NUMEL, dp * SHARD_NUMEL)
    elif bucket_numel is not None and (isinstance(bucket_numel, bool) or not isinstance(bucket_numel, int)
                                       or bucket_numel < 1):
        raise ValueError(f"bucket_numel must be a whole number >= 1, None (one bucket) or 'auto', got {bucket_numel!r}")
    return bucket_numel * dp if aligned and bucket_numel is not None else bucket_numel


@dataclass(frozen=True, slots=True)
class ParamSpec:
    """A parameter as the plan needs it: a name, its full (un-TP-split) shape and its TP split dim."""

    name: str
    full_shape: tuple[int, ...]
    tp_split_dim: int = -1


@dataclass(frozen=True, slots=True)
class DistMeta:
    name: str
    group_idx: int
    bucket_idx: int
    shape: tuple[int, ...]
    full_shape: tuple[int, ...]
    global_range: tuple[int, int]
    local_range: tuple[int, int]
    tp_split_dim: int
    param_idx: int = 0

    @property
    def buffer_idx(self) -> int:
        """The community tutorial's name for ``group_idx`` (a group is one virtual flat buffer), kept for code
        written against muongrid 0.4."""
        return self.group_idx

    @property
    def numel(self) -> int:
        return self.global_range[1] - self.global_range[0]

    @property
    def local_numel(self) -> int:
        return self.local_range[1] - self.local_range[0]

    @property
    def param_slice(self) -> slice:
        """The elements of the flattened TP-local parameter that this DP rank owns."""
        return slice(self.local_range[0] - self.global_range[0], self.local_range[1] - self.global_range[0])


@dataclass(frozen=True, slots=True)
class Bucket:
    group_idx: int
    bucket_idx: int
    start: int                      # offset of the bucket in its buffer
    numel: int                      # parameter elements (before padding)
    padded_numel: int               # dp * shard_numel: what a collective over the bucket moves
    param_indices: tuple[int, ...]  # which parameters of the group it holds
    dp: int
    cuts: tuple[int, ...] = ()      # dp + 1 offsets in the bucket: shard r is [cuts[r], cuts[r + 1])

    @property
    def buffer_idx(self) -> int:
        """``group_idx``'s name before 0.5 (see ``DistMeta.buffer_idx``)."""
        return self.group_idx

    @property
    def shard_numel(self) -> int:
        """Elements of one shard as it travels (the largest shard; shorter ones are padded)."""
        return self.padded_numel // self.dp

    def shard_range(self, dp_rank: int) -> tuple[int, int]:
        """[start, end) in buffer coordinates of the elements DP rank ``dp_rank`` owns."""
        return self.start + self.cuts[dp_rank], self.start + self.cuts[dp_rank + 1]

    def segments(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """Where bucket elements [lo, hi) sit in a flat tensor of ``dp`` padded shards laid end to end:
        (offset in [lo, hi), length, offset in the flat tensor), one per run of contiguous elements.
        With equal shards that is always one run: the flat tensor is the bucket plus end padding."""
        out: list[list[int]] = []
        for r in range(self.dp):
            a, b = max(lo, self.cuts[r]), min(hi, self.cuts[r + 1])
            if a < b:
                dst = r * self.shard_numel + a - self.cuts[r]
                if out and out[-1][2] + out[-1][1] == dst:
                    out[-1][1] += b - a
                else:
                    out.append([a - lo, b - a, dst])
        return [tuple(x) for x in out]


@dataclass(frozen=True)
class Plan:
    dp: int
    dp_rank: int
    tp: int
    buckets: list[list[Bucket]]          # per buffer (= parameter group)
    metas: list[list[DistMeta]]          # per buffer, one per parameter, in group order
    global_buffer_size: list[int] = field(default_factory=list)  # per buffer, padded
    layout: str = "bucket"
    owners: dict = field(default_factory=dict)  # (group_idx, param_idx) -> world rank; owner/aligned/group
    groups: dict = field(default_factory=dict)  # (group_idx, param_idx) -> member world ranks; group only

    @property
    def world(self) -> int:
        return self.dp * self.tp

    def bucket_of(self, meta: DistMeta) -> Bucket:
        return self.buckets[meta.group_idx][meta.bucket_idx]

    def shard_slice(self, meta: DistMeta) -> slice:
        """Where ``meta.local_range`` sits inside this rank's shard of its bucket."""
        lo = self.bucket_of(meta).shard_range(self.dp_rank)[0]
        return slice(meta.local_range[0] - lo, meta.local_range[1] - lo)

    def piece_slice(self, meta: DistMeta, dp_rank: int) -> slice:
        """The elements of the flattened TP-local parameter that DP rank ``dp_rank`` owns (maybe none)."""
        lo, hi = self.bucket_of(meta).shard_range(dp_rank)
        a, b = max(lo, meta.global_range[0]), min(hi, meta.global_range[1])
        return slice(a - meta.global_range[0], b - meta.global_range[0]) if a < b else slice(0, 0)

    def piece_numel(self, meta: DistMeta, dp_rank: int) -> int:
        piece = self.piece_slice(meta, dp_rank)
        return piece.stop - piece.start

    def owner_of(self, meta: DistMeta) -> int:
        return self.owners[(meta.group_idx, meta.param_idx)]

    def group_of(self, meta: DistMeta) -> tuple[int, ...] | None:
        """The ranks that orthogonalise ``meta`` together (``layout="group"``), or None if it has one owner."""
        return self.groups.get((meta.group_idx, meta.param_idx))

    def ns_keys(self, rank: int, group_idx: int) -> set:
        """(group_idx, param_idx) of every matrix of buffer ``group_idx`` (a Muon group) that world rank ``rank``
        orthogonalises, or takes part in orthogonalising, in a step: all of them under "bucket"; its own (and
        its groups') under the owner layouts."""
        keys = [(group_idx, meta.param_idx) for meta in self.metas[group_idx]]
        if self.layout == "bucket":
            return set(keys)
        return {k for k in keys if self.owners.get(k) == rank or rank in self.groups.get(k, ())}

    def local_state_numel(self) -> int:
        """Elements of optimizer state this DP rank keeps per state tensor (its shards, padding included)."""
        return sum(b.shard_numel for buf in self.buckets for b in buf)


def tp_local_shape(name: str, full_shape: tuple[int, ...], tp_split_dim: int, tp: int) -> tuple[int, ...]:
    """The shape one TP rank holds; a clear error when the split dim does not divide by ``tp``."""
    full_shape = tuple(full_shape)
    if tp_split_dim == -1 or tp == 1:
        return full_shape
    if not 0 <= tp_split_dim < len(full_shape):
        raise ValueError(f"parameter {name!r} of shape {full_shape}: tp_split_dim {tp_split_dim} is not "
                         f"a dimension (use -1 for a parameter replicated over TP)")
    if full_shape[tp_split_dim] % tp:
        raise ValueError(f"parameter {name!r} of shape {full_shape}: dimension {tp_split_dim} has size "
                         f"{full_shape[tp_split_dim]}, which does not divide by tp={tp}; choose another "
                         f"tp_split_dim, another --tp, or -1 (replicated)")
    local = list(full_shape)
    local[tp_split_dim] //= tp
    return tuple(local)


def split_into_buckets(numels: list[int], bucket_numel: int | None) -> list[list[int]]:
    """Group consecutive parameters into buckets of at most ``bucket_numel`` elements.

    A parameter larger than the limit gets a bucket of its own; ``None`` means one
    bucket.
    """
    buckets: list[list[int]] = []
    size = 0
    for i, n in enumerate(numels):
        full = bucket_numel is not None and size + n > bucket_numel and size > 0
        if not buckets or full:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += n
    return buckets


def build_plan(groups: list[list[ParamSpec]], dp: int, dp_rank: int, tp: int = 1,
               bucket_numel: int | str | None = "auto", layout: str = "bucket",
               muon: list[bool] | None = None, hw: dict | None = None) -> Plan:
    """Lay out every group's TP-local parameters in buffers and buckets, shard them over ``dp``, and
    (for the "owner" and "aligned" layouts) give every matrix of a Muon group (``muon[g]``, default
    all) its owner; under "group" an owner or a group of ranks, sized by FLOPs or, given a hardware
    profile ``hw`` (``hardware.py``), by time. The result is the same on every rank but for ``dp_rank``
    and ``local_range``."""
    check_layout(layout)
    hw = layout_hw(layout, hw)
    if not 0 <= dp_rank < dp:
        raise ValueError(f"dp_rank {dp_rank} outside 0..{dp - 1}")
    muon = [True] * len(groups) if muon is None else list(muon)
    all_buckets, all_metas, sizes = [], [], []
    for group_idx, specs in enumerate(groups):
        shapes = [tp_local_shape(s.name, s.full_shape, s.tp_split_dim, tp) for s in specs]
        numels = [math.prod(sh) for sh in shapes]
        buckets, metas = [], [None] * len(specs)
        offset = 0
        aligned = layout == "aligned" and muon[group_idx]
        limit = bucket_limit(bucket_numel, dp, aligned)
        for bucket_idx, members in enumerate(split_into_buckets(numels, limit)):
            sizes_in = [numels[i] for i in members]
            numel = sum(sizes_in)
            if aligned:
                cuts = aligned_cuts(sizes_in, dp)
                shard = max(map(operator.sub, cuts[1:], cuts[:-1]))
            else:   # equal shards of ceil(numel / dp), the first the largest; offsets computed when asked
                cuts = EvenCuts(numel, dp)
                shard = cuts.shard
            bucket = Bucket(group_idx, bucket_idx, offset, numel, shard * dp, tuple(members), dp, cuts)
            # BOOK-START dist-meta (chapter 4 shows the lines up to BOOK-END)
            shard_lo, shard_hi = bucket.shard_range(dp_rank)
            start = offset
            for i in members:
                end = start + numels[i]
                lo, hi = max(start, shard_lo), min(end, shard_hi)
                # an empty local range is anchored in our shard
                local = (lo, hi) if lo < hi else (shard_lo, shard_lo)
                metas[i] = DistMeta(specs[i].name, group_idx, bucket_idx, shapes[i],
                                    tuple(specs[i].full_shape), (start, end), local,
                                    specs[i].tp_split_dim, i)
                start = end
            # BOOK-END dist-meta
            buckets.append(bucket)
            offset += bucket.padded_numel
        all_buckets.append(buckets)
        all_metas.append(metas)
        sizes.append(offset)
    plan = Plan(dp, dp_rank, tp, all_buckets, all_metas, sizes, layout)
    if layout == "group":
        # split_b: the group layout runs zeropower_sharded with B's rows divided too (group_flow.group_newton_schulz)
        matrices = owner_candidates(plan, muon)
        shapes = {m.key: plan.metas[m.key[0]][m.key[1]].full_shape for m in matrices}
        owners, groups, _ = assign_owners_and_groups(matrices, dp * tp, shapes, split_b=True, tp=tp, hw=hw)
        plan.owners.update(owners)
        plan.groups.update(groups)
    elif layout != "bucket":
        plan.owners.update(assign_owners(owner_candidates(plan, muon), dp * tp))
    return plan


def layout_hw(layout: str, hw: dict | None) -> dict | None:
    """``hw`` checked (``hardware.check_hw``), or a ValueError if the layout takes no profile."""
    if hw is None:
        return None
    if layout != "group":
        raise ValueError(f"hw (a hardware profile) sizes the group layout's groups by time; it needs "
                         f"layout='group', not {layout!r}")
    return check_hw(hw)


def owner_candidates(plan: Plan, muon: list[bool]) -> list[Matrix]:
    """Every Muon matrix with its NS cost, what each rank holds of it (``HeldRuns``, from the bucket's cuts
    without asking every DP rank), and who may own it."""
    out, tp, world = [], plan.tp, plan.world
    every, flops_of = tuple(range(world)), {}   # flops per full shape: a model repeats a few shapes many times
    even = plan.layout != "aligned"
    for group_idx, metas in enumerate(plan.metas):
        if not muon[group_idx]:
            continue
        buckets = plan.buckets[group_idx]
        for meta in metas:
            runs = piece_runs(buckets[meta.bucket_idx], meta, even)
            held = HeldRuns(world, runs, tp)
            ranks = every
            if plan.layout == "aligned":  # only the TP ranks of the one DP rank that holds the matrix
                ranks = tuple(r for a, b, n in runs if n == meta.numel for r in range(a * tp, b * tp))
            shape = tuple(meta.full_shape)
            if shape not in flops_of:
                flops_of[shape] = ns_flops(shape)
            flops = flops_of[shape]
            out.append(Matrix((group_idx, meta.param_idx), flops, held, ranks, len(meta.full_shape) == 2))
    return out


def ns_flops(full_shape: tuple[int, ...]) -> int:
    """Newton-Schulz FLOPs of one Muon parameter: a matrix's ``ns5_flops``; a bank's (3-D: a MoE layer's experts
    in one tensor), each of its matrices'."""
    return math.prod(full_shape[:-2]) * ns5_flops(*full_shape[-2:])


def piece_runs(bucket: Bucket, meta: DistMeta, even: bool) -> list[tuple[int, int, int]]:
    """``Plan.piece_numel`` of ``meta`` for every DP rank, as runs (first DP rank, end DP rank, elements) of
    the ranks holding some, in order, none empty. With even cuts every shard strictly inside the matrix's range
    is whole, so those are one run (``even``; the aligned layout's callers ask for one run per DP rank): a matrix
    over 1,024 DP ranks costs three entries, not 1,024."""
    lo, hi, cuts = meta.global_range[0] - bucket.start, meta.global_range[1] - bucket.start, bucket.cuts
    if isinstance(cuts, EvenCuts) and lo < hi:
        # cut d at d * shard, and hi <= the bucket's numel: the first shard holds from lo, the last up to hi, and
        # every one between is whole; plain arithmetic, as this runs for each of 70,000 matrices several times
        shard = cuts.shard
        first, last = lo // shard, (hi - 1) // shard
        if first == last:
            return [(first, first + 1, hi - lo)]
        if last - first == 1:
            whole = []
        elif even:
            whole = [(first + 1, last, shard)]
        else:
            whole = [(d, d + 1, shard) for d in range(first + 1, last)]
        return [(first, first + 1, (first + 1) * shard - lo), *whole, (last, last + 1, hi - last * shard)]
    # uneven cuts (the aligned layout's, which never split a matrix) or an empty matrix: search the cuts
    first = max(0, bisect.bisect_right(cuts, lo) - 1)
    last = max(first, bisect.bisect_left(cuts, hi) - 1)
    count = lambda d: min(hi, cuts[d + 1]) - max(lo, cuts[d])  # noqa: E731
    return [(d, d + 1, count(d)) for d in range(first, min(last, bucket.dp - 1) + 1) if count(d) > 0]


def plan_key(groups: list[list[ParamSpec]], dtypes: list[list[str]], layout: str, bucket_numel: int | None,
             muon: list[bool], hw: dict | None = None) -> dict:
    """What every rank must agree on before the first collective: the same plan from the same input.
    A rank whose model differs (another shape, dtype or parameter order) would otherwise send buffers
    of another size, which hangs or fails far from the cause, or silently mixes parameters; one with
    another hardware profile would form other groups."""
    return dict(layout=layout, bucket_numel=bucket_numel, muon=list(muon), hw=layout_hw(layout, hw),
                params=[[(s.name, tuple(s.full_shape), s.tp_split_dim, dt) for s, dt in zip(specs, dts)]
                        for specs, dts in zip(groups, dtypes)])


def disagreement(keys: list[dict]) -> str | None:
    """The first difference between rank 0's ``plan_key`` and another rank's, in words (None if none)."""
    ref = keys[0]
    for rank, key in enumerate(keys[1:], start=1):
        if key["hw"] != ref["hw"]:
            mine, theirs = key["hw"], ref["hw"]
            diff = (f"given on rank {rank if mine else 0} but not on rank {0 if mine else rank}"
                    if mine is None or theirs is None else
                    ", ".join(f"{k} {mine[k]!r} on rank {rank} but {theirs[k]!r} on rank 0"
                              for k in mine if mine[k] != theirs[k]))
            return (f"the hardware profile (hw=) differs between ranks: {diff}. Every rank must pass the same "
                    "profile: the groups are sized on it")
        for field_name in ("layout", "bucket_numel", "muon"):
            if key[field_name] != ref[field_name]:
                return f"{field_name} is {key[field_name]!r} on rank {rank} but {ref[field_name]!r} on rank 0"
        if len(key["params"]) != len(ref["params"]):
            return f"rank {rank} has {len(key['params'])} parameter groups, rank 0 has {len(ref['params'])}"
        for g, (mine, theirs) in enumerate(zip(key["params"], ref["params"])):
            if len(mine) != len(theirs):
                return f"group {g} has {len(mine)} parameters on rank {rank}, {len(theirs)} on rank 0"
            for (name, shape, dim, dtype), (name0, shape0, dim0, dtype0) in zip(mine, theirs):
                if name != name0:
                    return f"group {g}: parameter {name!r} on rank {rank} stands where rank 0 has {name0!r}"
                if shape != shape0:
                    return (f"parameter {name!r}: full shape {list(shape)} on rank {rank}, {list(shape0)} on rank 0 "
                            "(the full shape is the local shape with its TP split dim times tp)")
                if dim != dim0:
                    return f"parameter {name!r}: tp_split_dim {dim} on rank {rank}, {dim0} on rank 0"
                if dtype != dtype0:
                    return f"parameter {name!r}: dtype {dtype} on rank {rank}, {dtype0} on rank 0"
    return None
