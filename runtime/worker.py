"""Entry point of one rank started by :mod:`moe_repro.runtime.launch` (``python -m moe_repro.runtime.worker``)."""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

from moe_repro.records.atomic import atomic_write_json, atomic_write_text
from moe_repro.runtime.launch import RankContext


def _load(target: str):
    module, _, func = target.partition(":")
    return getattr(importlib.import_module(module), func)


def _exit_when_parent_dies() -> None:
    """A rank never outlives the process that started it (repro, or mpiexec's proxy): the kernel's
    parent-death signal where available (Linux), and a thread that notices being re-parented."""
    from moe_repro.runtime.launch import die_with_parent

    die_with_parent()  # for ranks whose parent is mpiexec's proxy rather than repro
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


HEARTBEAT_S = 0.5


def _start_heartbeat(workdir: Path, rank: int) -> None:
    """Every HEARTBEAT_S, write when this rank last ran and where its main thread is (innermost
    Python frame). A stopped process stops beating; a rank blocked in a collective beats from
    inside the communication library -- launch.py tells a hung rank from its waiting peers so."""
    main_thread = threading.main_thread()
    path = workdir / f"rank-{rank}.beat"

    def where() -> str:
        frame = sys._current_frames().get(main_thread.ident)
        return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}" if frame else "?"

    def beat() -> None:
        while True:
            try:
                atomic_write_json(path, {"t": time.time(), "where": where(), "pid": os.getpid()})
            except OSError:
                return  # the work directory is gone: the run is over
            time.sleep(HEARTBEAT_S)

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    _exit_when_parent_dies()
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--workdir", required=True, type=Path)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--ranks-per-node", type=int, required=True)
    ap.add_argument("--backend", required=True)
    ap.add_argument("--rank", type=int)
    ap.add_argument("--master-port", type=int)
    a = ap.parse_args(argv)

    comm = None
    if a.backend == "mpi":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank = comm.Get_rank()
        if comm.Get_size() != a.world_size:
            raise SystemExit(f"mpiexec started {comm.Get_size()} ranks, expected {a.world_size}")
    else:
        rank = a.rank
    _start_heartbeat(a.workdir, rank)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(a.world_size),
                      LOCAL_RANK=str(rank % a.ranks_per_node),
                      LOCAL_WORLD_SIZE=str(a.ranks_per_node),
                      GROUP_RANK=str(rank // a.ranks_per_node))
    try:
        import torch

        torch.set_num_threads(int(os.environ.get("MOE_REPRO_THREADS", "1")))
        if a.backend != "mpi":
            import torch.distributed as dist

            from moe_repro.runtime.device import bind, rank_device

            bind(rank_device(a.backend, rank % a.ranks_per_node))  # nccl: this rank's GPU first
            dist.init_process_group(a.backend, init_method=f"tcp://127.0.0.1:{a.master_port}",
                                    rank=rank, world_size=a.world_size,
                                    timeout=datetime.timedelta(seconds=300))
        ctx = RankContext(rank=rank, world_size=a.world_size, ranks_per_node=a.ranks_per_node,
                          backend=a.backend, comm=comm)
        kwargs = json.loads((a.workdir / "kwargs.json").read_text())
        result = _load(a.target)(ctx, **kwargs)
        atomic_write_json(a.workdir / f"rank-{rank}.json", result)
        if a.backend != "mpi":
            import torch.distributed as dist

            dist.destroy_process_group()
    except BaseException:
        atomic_write_text(a.workdir / f"rank-{rank}.failed", traceback.format_exc())
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)  # do not wait on peers stuck in a collective
    if a.backend != "mpi":
        # The result is written and every group shut down: leave without the interpreter's
        # finalization, where gloo's threads and the subgroups' process groups that Python
        # objects still hold are torn down in no set order and can abort the rank (SIGABRT,
        # "terminate called without an active exception": seen once in CI, after every point
        # of the run had been stored; pytorch/pytorch#179291 describes the same abort), as
        # moe_repro.cli._exit_launched_rank does for ranks a launcher started. MPI ranks exit
        # normally: mpi4py finalizes MPI at exit, which mpiexec expects.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
