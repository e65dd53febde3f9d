"""Rank targets for the launcher tests (imported by real rank processes)."""

import os
import signal
import time


def identity(ctx, tag):
    return {
        "rank": ctx.rank,
        "world": ctx.world_size,
        "node": ctx.node,
        "local": ctx.local_rank,
        "tag": tag,
        "env_local_rank": int(os.environ["LOCAL_RANK"]),
        "env_group_rank": int(os.environ["GROUP_RANK"]),
    }


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


def aborts_in_teardown(ctx, victim):
    """The victim aborts (SIGABRT, as a C++ std::terminate does) after its result is returned,
    while the process tears down. gloo: in destroy_process_group, at once, while its peers are
    still at work (they take a second more). MPI: at exit, once every rank's result file is in
    the work directory (mpiexec may end the other ranks when one aborts)."""
    import sys
    from pathlib import Path

    if ctx.rank != victim:
        time.sleep(1.0)
        return ctx.rank
    if ctx.backend == "mpi":
        import atexit

        workdir = Path(sys.argv[sys.argv.index("--workdir") + 1])

        def abort_when_all_written():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not all(
                (workdir / f"rank-{r}.json").exists() for r in range(ctx.world_size)
            ):
                time.sleep(0.02)
            os.abort()

        atexit.register(abort_when_all_written)
    else:
        import torch.distributed as dist

        def abort_instead(*args, **kwargs):
            os.abort()

        dist.destroy_process_group = abort_instead
    return ctx.rank


def aborts_before_its_result(ctx, victim):
    if ctx.rank == victim:
        os.abort()
    time.sleep(60)  # the others wait, as on a peer in a collective
    return ctx.rank
