"""Rank targets for the launcher tests (imported by real rank processes)."""

import os
import signal
import time


def identity(ctx, tag):
    return {"rank": ctx.rank, "world": ctx.world_size, "node": ctx.node, "local": ctx.local_rank,
            "tag": tag, "env_local_rank": int(os.environ["LOCAL_RANK"]),
            "env_group_rank": int(os.environ["GROUP_RANK"])}


def allreduce_sum(ctx):
    if ctx.backend == "mpi":
        return ctx.comm.allreduce(ctx.rank + 1)
    import torch
    import torch.distributed as dist

    t = torch.tensor([ctx.rank + 1.0])
    dist.all_reduce(t)
    return t.item()


def killed_mid_collective(ctx, victim):
    """The victim SIGKILLs itself while the others are inside all-reduces."""
    import torch
    import torch.distributed as dist

    t = torch.ones(1024)
    for i in range(100000):
        if ctx.rank == victim and i == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(t)
    return "unreachable"


def raises(ctx, victim):
    if ctx.rank == victim:
        raise ValueError("deliberate failure on the victim rank")
    time.sleep(60)  # the others would wait forever in a real collective
    return ctx.rank


def hangs(ctx, victim):
    if ctx.rank == victim:
        time.sleep(3600)
    return ctx.rank
