"""``repro doctor``: the self-test a user runs on a new node before trusting its numbers.

On a GPU node it checks the driver and the GPUs, NCCL's all-reduce and all-to-all over two GPUs
(#wrong: elements that differ from the exact expected values), the Triton kernels against the
PyTorch implementations, one trainer step under nccl against the single-process reference, and
the copy-engine path of FEPLB's expert copy (copy, compute and hidden time). On a CPU machine it
runs the CPU half -- the same collectives over two gloo ranks, the Triton kernels in interpreter
mode when triton is installed, the trainer step over gloo, the copy path on gloo's worker thread
-- and lists what it could not check. Exit 1 when any check fails.

Every collective check uses values it can verify exactly: the all-reduce sums small integers;
the all-to-all sends uneven row counts whose values encode (source, destination, row).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import dataclass

import click

from moe_repro.cli.errors import RunFailure

TRAINER_TOL = (
    1e-5  # the trainer's fp32 bound against the single-process reference (tests/test_trainer.py)
)


@dataclass
class Check:
    name: str
    status: str  # passed | failed | skipped
    detail: str


# --- rank targets (run inside launched worlds) --------------------------------------------------


def collectives_rank(ctx, elements: int = 4096) -> dict:
    """All-reduce and uneven all-to-all on this rank's device; counts of wrong elements."""
    import torch
    import torch.distributed as dist

    device, world, rank = ctx.device, ctx.world_size, ctx.rank
    t = torch.full((elements,), float(rank + 1), device=device)
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    reduce_wrong = int((t != expected).sum().item())

    # rank r sends r + d + 1 rows of 8 values to rank d, value = 1e4 r + 100 d + row
    send_counts = [rank + d + 1 for d in range(world)]
    recv_counts = [s + rank + 1 for s in range(world)]
    send = torch.cat(
        [
            torch.arange(c, dtype=torch.float32).unsqueeze(1).expand(c, 8) + 1e4 * rank + 100 * d
            for d, c in enumerate(send_counts)
        ]
    ).to(device)
    recv = torch.empty(sum(recv_counts), 8, device=device)
    dist.all_to_all_single(
        recv, send.contiguous(), output_split_sizes=recv_counts, input_split_sizes=send_counts
    )
    want = torch.cat(
        [
            torch.arange(c, dtype=torch.float32).unsqueeze(1).expand(c, 8) + 1e4 * s + 100 * rank
            for s, c in enumerate(recv_counts)
        ]
    ).to(device)
    a2a_wrong = int((recv != want).sum().item())
    return {
        "device": str(device),
        "allreduce_wrong": int(ctx.all_reduce_max(float(reduce_wrong))),
        "alltoall_wrong": int(ctx.all_reduce_max(float(a2a_wrong))),
    }


def copy_path_rank(ctx) -> dict:
    """One FEPLB layer forward whose routing makes the balancer copy an expert; the copy's path
    and its measured overlap with the static experts' compute."""
    import torch

    from moe_repro.components.balance.feplb import FEPLBMoELayer

    device = ctx.device
    torch.manual_seed(0)
    h, f, e = 64, 256, 4
    layer = FEPLBMoELayer(h, f, e, 2, dyn=1, expert_parallel=True, device=device)
    with torch.no_grad():
        # every token picks experts 1 and 0, both rank 0's; expert 1 is its dynamic one (the
        # last, without history), so the balancer must copy it to rank 1
        layer.gate.weight.zero_()
        layer.gate.weight[0, 1] = 4.0
        layer.gate.weight[0, 0] = 3.0
    x = torch.randn(512, h, device=device)
    x[:, 0] = 1.0
    layer(x)
    copy = layer.stats.copy
    overlap = copy.overlap() if copy is not None else None
    return {
        "moves": len(layer.stats.plan.moves) if layer.stats.plan else 0,
        "overlap": vars(overlap) if overlap else None,
    }


# --- the checks ---------------------------------------------------------------------------------


def _versions() -> dict:
    import torch

    from moe_repro.runtime.device import cuda_count

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda build": torch.version.cuda or "none (CPU build)",
        "gpus": cuda_count(),
    }
    if cuda_count():
        out["gpu"] = torch.cuda.get_device_name(0)
        try:
            out["driver"] = ".".join(map(str, divmod(torch._C._cuda_getDriverVersion(), 1000)))
        except (AttributeError, RuntimeError):
            out["driver"] = "unknown"
        try:
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except (AttributeError, RuntimeError):
            out["nccl"] = "unavailable"
    try:  # the version without importing triton: importing it fixes interpreter mode off
        from importlib.metadata import version

        out["triton"] = version("triton")
    except ImportError:  # PackageNotFoundError
        out["triton"] = "not installed"
    return out


def _run_world(target: str, backend: str, kwargs: dict | None = None, timeout_s: float = 180.0):
    from moe_repro.runtime.launch import run_ranks

    return run_ranks(target, kwargs or {}, world_size=2, backend=backend, timeout_s=timeout_s)


def check_collectives(backend: str, label: str) -> Check:
    name = f"{label} all-reduce and all-to-all, 2 ranks"
    try:
        r = _run_world("moe_repro.cli.doctor_cmd:collectives_rank", backend)[0]
    except Exception as e:  # a rank that died or hung: the check failed, say why in one line
        return Check(
            name, "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        )
    wrong = r["allreduce_wrong"] + r["alltoall_wrong"]
    return Check(
        name,
        "passed" if wrong == 0 else "failed",
        f"on {r['device']}: all-reduce #wrong {r['allreduce_wrong']}, "
        f"all-to-all #wrong {r['alltoall_wrong']}",
    )


def check_triton(on_gpu: bool) -> Check:
    name = "Triton kernels vs PyTorch (grouped GEMM, gather, combine; fwd+bwd)"
    if on_gpu:
        return _triton_check(name, on_gpu)
    # Interpreter mode, in a child process: TRITON_INTERPRET must be set before triton is first
    # imported (its library functions are fixed then).
    name += ", interpreter mode"
    code = (
        "import json; from moe_repro.cli.doctor_cmd import _triton_check; "
        f"print(json.dumps(vars(_triton_check({name!r}, False))))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return Check(name, "failed", f"the check's process exited {r.returncode}: {last}")
    return Check(**json.loads(r.stdout.strip().splitlines()[-1]))


def _triton_check(name: str, on_gpu: bool) -> Check:
    from moe_repro.components.moe.triton_support import triton_unavailable

    why = triton_unavailable()
    if why:
        return Check(name, "skipped", why)
    import torch

    from moe_repro.components.moe.grouped_gemm import grouped_gemm
    from moe_repro.components.moe.pft import build_pft, gather_tokens, scatter_combine

    from moe_repro.runtime.device import resolve_device

    device = resolve_device("auto")  # the first GPU when there is one (on_gpu), else the CPU
    worst = {}
    g = torch.Generator().manual_seed(7)
    for dtype, tol in ((torch.float32, 1e-5), (torch.float16, 2e-3)):
        counts = torch.tensor([0, 5, 37, 0, 70])
        x = torch.randn(int(counts.sum()), 24, generator=g).to(device, dtype).requires_grad_()
        w = torch.randn(5, 24, 40, generator=g).to(device, dtype).mul_(0.2).requires_grad_()
        dy = torch.randn(int(counts.sum()), 40, generator=g).to(device, dtype)
        got = {}
        for kernel in ("sequential", "triton"):
            y = grouped_gemm(x, w, counts, kernel)
            got["gemm " + kernel] = (y.detach(), *torch.autograd.grad(y, (x, w), dy))
        top = torch.randint(0, 6, (29, 2), generator=g).to(device)
        cw = torch.rand(29, 2, generator=g).to(device, dtype)
        tokens = torch.randn(29, 72, generator=g).to(device, dtype)
        for impl in ("torch", "triton"):
            xi, wi = tokens.clone().requires_grad_(), cw.clone().requires_grad_()
            pft = build_pft(top, wi, 6, capacity=3)
            out = scatter_combine(gather_tokens(xi, pft, impl=impl) * 0.5, pft, impl=impl)
            got["permute " + impl] = (
                out.detach(),
                *torch.autograd.grad(out, (xi, wi), torch.ones_like(out)),
            )
        err = max(
            float((a.double() - b.double()).abs().max()) / max(1.0, float(b.abs().max()))
            for pair in (("gemm triton", "gemm sequential"), ("permute triton", "permute torch"))
            for a, b in zip(got[pair[0]], got[pair[1]])
            if b.numel()
        )
        worst[str(dtype).removeprefix("torch.")] = (err, tol)
    ok = all(err <= tol for err, tol in worst.values())
    return Check(
        name,
        "passed" if ok else "failed",
        ", ".join(f"{k}: max rel diff {e:.1e} (bound {t:.0e})" for k, (e, t) in worst.items()),
    )


def check_trainer(backend: str) -> Check:
    from moe_repro.components.training.pp_ep_trainer import TrainConfig, launch_training

    name = f"one trainer step (EP=2 over {backend}) vs the single-process reference"
    cfg = TrainConfig(
        model="tiny-moe",
        n_layers=2,
        seq_len=32,
        micro_batches=2,
        micro_batch_size=2,
        steps=1,
        ep=2,
        check_reference=True,
    )
    try:
        report = launch_training(cfg, timeout_s=300.0, backend=backend)
    except Exception as e:
        return Check(
            name, "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        )
    diff = float(report["reference_max_abs_diff"])
    return Check(
        name,
        "passed" if diff <= TRAINER_TOL else "failed",
        f"max |difference| of loss and gradients {diff:.1e} (bound {TRAINER_TOL:.0e})",
    )


def check_copy_path(backend: str) -> Check:
    name = f"FEPLB expert copy path over {backend}, 2 ranks"
    try:
        r = _run_world("moe_repro.cli.doctor_cmd:copy_path_rank", backend)
    except Exception as e:
        return Check(
            name, "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        )
    o = next((x["overlap"] for x in r if x["overlap"]), None)
    if not r[0]["moves"] or o is None:
        return Check(name, "failed", "the balancer copied no expert, or the copy was not measured")
    bad = not (o["copy_s"] > 0 and 0 <= o["hidden_s"] <= min(o["copy_s"], o["compute_s"]) + 1e-9)
    return Check(
        name,
        "failed" if bad else "passed",
        f"{o['path']}; copy {o['copy_s'] * 1e3:.3f} ms, static compute "
        f"{o['compute_s'] * 1e3:.3f} ms, hidden {o['hidden_s'] * 1e3:.3f} ms "
        f"({100 * o['hidden_s'] / o['copy_s']:.0f}% of the copy; {o['clock']})",
    )


def run_checks() -> tuple[dict, list[Check]]:
    from moe_repro.runtime.device import cuda_count, no_gpu_reason

    versions = _versions()
    gpus = cuda_count()
    checks: list[Check] = []
    if gpus:
        checks.append(
            Check(
                "driver and GPUs",
                "passed",
                f"{gpus} x {versions['gpu']}, driver {versions['driver']}",
            )
        )
    else:
        checks.append(Check("driver and GPUs", "skipped", no_gpu_reason()))
    two_gpus = gpus >= 2
    why_not_nccl = "no GPU" if not gpus else f"{gpus} GPU: the 2-rank checks need 2"
    # CPU half: always (the gloo path is what every CPU-side number in this project used)
    checks.append(check_collectives("gloo", "gloo (CPU)"))
    checks.append(check_triton(on_gpu=bool(gpus)))
    checks.append(check_trainer("gloo"))
    checks.append(check_copy_path("gloo"))
    # GPU half
    if two_gpus:
        checks.append(check_collectives("nccl", "NCCL (2 GPUs)"))
        checks.append(check_trainer("nccl"))
        checks.append(check_copy_path("nccl"))
    else:
        for what in (
            "NCCL all-reduce and all-to-all, 2 GPUs",
            "one trainer step over nccl vs the single-process reference",
            "FEPLB expert copy on its CUDA stream (copy-engine overlap)",
        ):
            checks.append(Check(what, "skipped", why_not_nccl))
    return versions, checks


@click.command("doctor")
def command() -> None:
    """Self-test this node: GPUs, NCCL collectives (#wrong), Triton kernels vs PyTorch, one
    trainer step vs the single-process reference, and the FEPLB copy-engine overlap.

    Prints each check as passed / failed / skipped with the versions it ran with; exits 1 when
    any check fails. Without a GPU it runs the CPU half (gloo, Triton's interpreter when triton
    is installed) and lists what it could not check.
    """
    versions, checks = run_checks()
    click.echo("repro doctor: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    width = max(len(c.status) for c in checks)
    for c in checks:
        click.echo(f"  {c.status:<{width}}  {c.name}: {c.detail}")
    counts = {s: sum(c.status == s for c in checks) for s in ("passed", "failed", "skipped")}
    click.echo(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
    skipped = [c.name for c in checks if c.status == "skipped"]
    if skipped:
        click.echo("not checked on this machine: " + "; ".join(skipped))
    if counts["failed"]:
        raise RunFailure(
            f"{counts['failed']} check(s) failed: "
            + "; ".join(c.name for c in checks if c.status == "failed")
        )
