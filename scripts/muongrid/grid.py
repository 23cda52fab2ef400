"""The DP x TP grid: the one place that decides which rank is which and builds the process groups.

Ranks are laid out TP-fastest: ``rank = dp_rank * tp + tp_rank``. A TP group is a row of
consecutive ranks (they share one model replica's layers, so on a cluster they should share a
node and its fast links); a DP group is a column (the same TP shard in every replica).

    dp=2, tp=4:   tp groups {0,1,2,3} {4,5,6,7}     dp groups {0,4} {1,5} {2,6} {3,7}

``grid_layout`` is pure (no processes) so the book can draw any grid; ``Grid.build`` makes the
real groups with ``init_device_mesh(..., mesh_dim_names=("dp", "tp"))`` after
``init_process_group`` has run (see ``launch.py``).

**Expert parallelism.** ``grid.expert(ep)`` is the grid an expert-parallel parameter group runs on: the DP
ranks are dealt round-robin into ``ep`` expert-parallel ranks (DP rank d holds expert slice ``d % ep``), and
the ranks that hold the same experts (their ``dp / ep`` replicas, times TP) form a smaller grid of their own:
its DP group averages those experts' gradients and shards their optimizer state, its "world" is where their
Newton-Schulz is placed. An optimizer built on it is an ordinary ``DistributedMuon``:

    dp=4, tp=1, ep=2:  expert slice 0 on ranks {0, 2} (its grid: dp 2), slice 1 on ranks {1, 3}

    dense = DistributedMuon(dense_groups, grid)                 # attention, shared experts, embeddings...
    experts = DistributedMuon(expert_groups, grid.expert(2))    # this rank's routed experts
    prepare_together([dense, experts]); dense.step(); experts.step()   # one NaN/Inf verdict for both (contract.py)

Every group made here carries the job grid's ``timeout`` (``Grid.build``), as the dp and tp groups do.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist


def check_grid(dp: int, tp: int, world_size: int | None = None) -> None:
    """Raise a clear error for a grid that cannot be built."""
    if dp < 1 or tp < 1:
        raise ValueError(f"--dp and --tp must be at least 1, got dp={dp}, tp={tp}")
    if world_size is not None and world_size != dp * tp:
        raise ValueError(
            f"world size {world_size} does not equal dp*tp = {dp}*{tp} = {dp * tp}; "
            f"launch exactly {dp * tp} processes (e.g. torchrun --nproc-per-node {dp * tp}) or change --dp/--tp"
        )


def subgroup_options(timeout: datetime.timedelta | None) -> dict | None:
    """``init_device_mesh``'s ``backend_override`` that gives the dp and tp groups ``timeout`` (gloo, NCCL).
    None (the backend's defaults) without a timeout or for another backend (the fake group of the tests)."""
    if timeout is None or not dist.is_initialized():
        return None
    backend = dist.get_backend()
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()
    elif backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
    else:
        return None
    options._timeout = timeout
    return {"dp": (backend, options), "tp": (backend, options)}


def grid_layout(dp: int, tp: int) -> list[dict]:
    """For every rank: its dp_rank, tp_rank and the ranks of its DP and TP groups."""
    check_grid(dp, tp)
    return [dict(rank=r, dp_rank=r // tp, tp_rank=r % tp,
                 dp_group=[d * tp + r % tp for d in range(dp)],
                 tp_group=[(r // tp) * tp + t for t in range(tp)])
            for r in range(dp * tp)]


@dataclass
class Grid:
    """This rank's place in the grid and its two process groups."""

    dp: int
    tp: int
    rank: int
    dp_rank: int
    tp_rank: int
    dp_group: object
    tp_group: object
    device: torch.device
    mesh: object = None
    world_group: object = None   # the group of the grid's ranks (None: every rank of the job)
    global_ranks: tuple = ()     # the job's rank of each grid rank (empty: the same numbers)
    host_group: object = None    # an expert grid: its slice's world group (the optimizers vote on the device)
    ep: int = 1                  # expert-parallel ranks this grid was cut into (1: not an expert grid)
    timeout: datetime.timedelta | None = None   # every collective's limit on the groups made for this grid
    job_host_group: object = None   # unused since the vote moved to the device (kept for callers that read it)

    @classmethod
    def build(cls, dp: int, tp: int, device: torch.device | str = "cpu", timeout: datetime.timedelta | None = None
              ) -> "Grid":
        """Make the DP and TP groups of the current job (needs ``init_process_group`` first).

        On CUDA this rank's GPU becomes the current device first (NCCL, ``all_gather_object`` and a model
        moved with ``.cuda()`` all use the current device). ``timeout`` bounds every collective of the dp
        and tp groups too: subgroups do not inherit the world group's timeout (NCCL's default is 10 min).
        """
        from torch.distributed.device_mesh import init_device_mesh

        check_grid(dp, tp, dist.get_world_size())
        device = torch.device(device)
        if device.type == "cpu":   # "cpu:0" (HF TrainingArguments.device) is the CPU: tensors say "cpu"
            device = torch.device("cpu")
        if device.type == "cuda":
            if device.index is None:
                raise ValueError("Grid.build needs a CUDA device with an index (cuda:I): use "
                                 "muongrid.devices.rank_device('nccl'), which picks cuda:{LOCAL_RANK % device_count()}")
            torch.cuda.set_device(device)
        mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"),
                                backend_override=subgroup_options(timeout))
        rank = dist.get_rank()
        me = grid_layout(dp, tp)[rank]
        grid = cls(dp, tp, rank, me["dp_rank"], me["tp_rank"], mesh.get_group("dp"),
                   mesh.get_group("tp"), device, mesh, timeout=timeout)
        # The mesh must agree with our layout; if a future torch changed it, fail loudly here.
        got = (dist.get_process_group_ranks(grid.dp_group), dist.get_process_group_ranks(grid.tp_group))
        if got != (me["dp_group"], me["tp_group"]):
            raise RuntimeError(f"device mesh groups {got} differ from the expected layout {me}")
        return grid

    @classmethod
    def from_mesh(cls, mesh) -> "Grid":
        """The grid of a 1-D device mesh someone else made: every rank of the job, in rank order, on one DP
        dimension of any name (``fully_shard(model)``'s default mesh, Accelerate's FSDP2 mesh); no TP. Its group
        is the mesh's own, with the timeout it was made with (a 1-D mesh over the job uses the default group)."""
        if not dist.is_initialized():
            raise RuntimeError("Grid.from_mesh needs init_process_group first (the mesh's group belongs to it)")
        ranks, world = [int(r) for r in mesh.mesh.reshape(-1)], dist.get_world_size()
        if mesh.ndim != 1 or ranks != list(range(world)):
            raise ValueError(f"Grid.from_mesh takes a 1-D mesh over every rank of the job in order (0..{world - 1}); "
                             f"this one is {mesh.ndim}-D {tuple(mesh.mesh_dim_names or ())} on ranks "
                             f"{mesh.mesh.tolist()}: for DP x TP use Grid.build(dp, tp) and shard on grid.mesh['dp']")
        device = torch.device(mesh.device_type)
        if device.type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device())
        rank = dist.get_rank()
        return cls(world, 1, rank, rank, 0, mesh.get_group(0), None, device, mesh)

    @classmethod
    def single(cls, device: torch.device | str = "cpu") -> "Grid":
        """A 1 x 1 grid with no process groups, for running the distributed code in one process."""
        return cls(1, 1, 0, 0, 0, None, None, torch.device(device))

    def expert(self, ep: int) -> "Grid":
        """The grid of this rank's expert slice (see the module docstring). Collective: every rank of the job
        must call it, with the same ``ep``, since it makes every slice's process groups."""
        if ep < 1 or self.dp % ep:
            raise ValueError(f"ep={ep} must divide dp={self.dp}: the DP ranks are dealt into ep expert-parallel ranks")
        if self.ep != 1:
            raise ValueError("this grid is already an expert grid; call expert() on the job's grid")
        tp, mine = self.tp, self.dp_rank % ep
        worlds = [[d * tp + t for d in range(self.dp) if d % ep == e for t in range(tp)] for e in range(ep)]
        if self.dp * self.tp == 1 or not dist.is_initialized():
            return Grid(self.dp // ep, tp, self.rank, self.dp_rank // ep, self.tp_rank, None, None, self.device,
                        ep=ep)
        world_groups, dp_groups, hosts = [], {}, []
        limit = {} if self.timeout is None else dict(timeout=self.timeout)   # as the job grid's groups
        for e in range(ep):   # every rank makes every group, in the same order
            world_groups.append(dist.new_group(worlds[e], **limit))
            hosts.append(world_groups[-1])   # no gloo group beside NCCL: the step's vote runs on the device
            for t in range(tp):
                dp_groups[(e, t)] = dist.new_group([d * tp + t for d in range(self.dp) if d % ep == e], **limit)
        job_host = None   # the step's vote spans the job on the device (contract.vote), over the default group
        sub_rank = worlds[mine].index(self.rank)
        return Grid(self.dp // ep, tp, sub_rank, self.dp_rank // ep, self.tp_rank, dp_groups[(mine, self.tp_rank)],
                    self.tp_group, self.device, None, world_groups[mine], tuple(worlds[mine]), hosts[mine], ep,
                    self.timeout, job_host)

    def describe(self) -> dict:
        """What this rank is, from the real process groups (used by the book's grid chapter)."""
        ranks = (lambda g: dist.get_process_group_ranks(g)) if self.dp_group is not None else (lambda g: [0])
        return dict(rank=self.rank, dp_rank=self.dp_rank, tp_rank=self.tp_rank,
                    dp_group=ranks(self.dp_group), tp_group=ranks(self.tp_group))
