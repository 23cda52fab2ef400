"""One launch, several grids of its world size: what ep_run.py and qkclip_run.py use so a test starts its
processes once for every grid of a world size (``--configs`` / ``--grids``)."""
import datetime

from muongrid import Grid


def grid_of(grid, shape: str, timeout_s: float):
    """(dp, tp, grid) for ``shape`` ("DPxTP"): the launch's own ``grid`` when it is that one, else a grid of
    that shape built inside the launch on the same ranks (its world size must be the launch's)."""
    dp, tp = (int(v) for v in shape.split("x"))
    if (dp, tp) == (grid.dp, grid.tp):
        return dp, tp, grid
    return dp, tp, Grid.build(dp, tp, grid.device, timeout=datetime.timedelta(seconds=timeout_s))
