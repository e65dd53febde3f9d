"""What only a GPU node can check (``pytest -m gpu``): CUDA-event timing, NCCL collectives,
the compiled Triton kernels, the trainer under nccl, the copy-engine path, ``repro doctor``.
Skipped without a CUDA GPU (the CPU halves run in test_device.py, test_triton_kernels.py,
test_feplb.py and test_doctor.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from moe_repro.runtime.device import cuda_count

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
two_gpus = pytest.mark.skipif(cuda_count() < 2, reason="needs 2 GPUs")


def test_cuda_events_time_the_kernels_not_their_launch():
    from moe_repro.runtime.timing import CudaEventTimer, HostTimer, timer_for

    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    timer = timer_for(a.device)
    assert isinstance(timer, CudaEventTimer)
    timer.start()
    for _ in range(20):
        a @ a
    device_s = timer.stop()
    host = HostTimer()
    torch.cuda.synchronize()
    host.start()
    for _ in range(20):
        a @ a
    launch_s = host.stop()  # returns once the kernels are queued
    torch.cuda.synchronize()
    # 20 GEMMs of 2 * 4096^3 FLOPs take milliseconds of device time; queuing them does not
    assert device_s > 0 and device_s > launch_s


def test_auto_device_is_the_gpu_and_bench_takes_cuda(tmp_path):
    from moe_repro.runtime.device import resolve_device

    assert resolve_device("auto").type == "cuda"
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from moe_repro.cli import main; main()",
            "--results",
            str(tmp_path),
            "bench",
            "gemm",
            "--device",
            "cuda",
            "--param",
            "n=256",
            "--repeats",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]


@two_gpus
def test_nccl_collectives_have_no_wrong_elements():
    from moe_repro.cli.doctor_cmd import check_collectives

    c = check_collectives("nccl", "NCCL")
    assert c.status == "passed", c.detail


def test_compiled_triton_kernels_match_pytorch():
    from moe_repro.cli.doctor_cmd import check_triton

    c = check_triton(on_gpu=True)
    if c.status == "skipped":
        pytest.skip(c.detail)
    assert c.status == "passed", c.detail


@two_gpus
def test_trainer_step_over_nccl_matches_the_reference():
    from moe_repro.cli.doctor_cmd import check_trainer

    c = check_trainer("nccl")
    assert c.status == "passed", c.detail


@two_gpus
def test_expert_copy_runs_on_its_cuda_stream():
    from moe_repro.cli.doctor_cmd import check_copy_path
    from moe_repro.components.balance.expert_copy import CUDA_PATH

    c = check_copy_path("nccl")
    assert c.status == "passed" and CUDA_PATH in c.detail, c.detail


def test_repro_doctor_passes():
    r = subprocess.run(
        [sys.executable, "-c", "from moe_repro.cli import main; main()", "doctor"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(r.stdout)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-2000:])
