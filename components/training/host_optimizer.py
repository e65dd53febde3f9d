"""Pipelined AdamW step with host-resident optimizer state (MoP Sec. 3.5).

MoP keeps AdamW's ~12 bytes/parameter of fp32 state (master weights, m, v) off the GPU and
"issues the update in parallel with work already on the critical path (including the backward
pass) ... using only a small transient device working set". Lossless: it reorders data movement
and computation, never the arithmetic.

Here:
- state (m, v, and, for parameters on an accelerator, an fp32 master copy) lives in host memory
  (pinned where CUDA is present, so copies can be asynchronous);
- the update is cut into chunks of ``chunk_elems`` elements handed to a pool of host worker
  threads (torch's elementwise kernels release the GIL, so they run beside the main thread);
- with :meth:`HostPipelinedAdamW.overlap_with_backward`, a parameter's chunks are queued the
  moment autograd has accumulated its gradient (``register_post_accumulate_grad_hook``), so the
  updates of late layers run while backward is still computing early layers; ``step()`` then
  only queues what is left and waits;
- on a GPU each chunk goes grad D2H -> host update -> param H2D on a side copy stream,
  so only one chunk's staging buffers are in flight per worker.

Exactness: per element, the arithmetic is exactly torch.optim.AdamW's single-tensor path
(``foreach=False``; the default on CPU): decoupled decay ``p *= 1 - lr wd``, ``m.lerp_(g, 1-b1)``,
``v = b2 v + (1-b2) g^2``, ``p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)``. Chunks are
disjoint slices, so the order in which threads run them cannot change any result: the test
checks bitwise equality after several steps.

Bytes per step (GPU path), per parameter element: grad D2H 4 + param H2D 4 (fp32), state
traffic stays in host memory. Device working set: one staging chunk per worker.
Limitations: in overlap mode nothing may look at all gradients before the update (no global
gradient-norm clipping); amsgrad, maximize and capturable are not implemented.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypedDict

import torch

from moe_repro.runtime.device import cuda_count


class ParamState(TypedDict):
    """One parameter's optimizer state on the host."""

    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    master: torch.Tensor | None  # fp32 master copy (None: the parameter lives on the host)
    copy_stream: torch.cuda.Stream | None  # the H2D copy stream of a parameter off the host


class HostPipelinedAdamW:
    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        chunk_elems: int = 1 << 16,
        workers: int = 1,
    ):
        self.params = [p for p in params]
        if not self.params:
            raise ValueError("HostPipelinedAdamW got no parameters")
        if chunk_elems < 1 or workers < 1:
            raise ValueError(f"chunk_elems ({chunk_elems}) and workers ({workers}) must be >= 1")
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError("need lr, eps, weight_decay >= 0 and betas in [0, 1)")
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.chunk_elems = chunk_elems
        self.step_count = 0  # step() calls
        self.param_steps = [0] * len(self.params)
        self.queued_during_backward = 0  # parameters of the last step queued before step()
        self.chunks_done_before_step = 0  # chunks of the last step finished before step()
        self.chunks_total_last_step = 0
        self._chunks_done = 0
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="host-adamw")
        self._lock = threading.Lock()
        self._pending: list[Future] = []
        self._queued: set[int] = set()
        self._step_open = False
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        pin = cuda_count() > 0  # pinned host buffers only where a GPU copies from them
        self.state: list[ParamState] = []
        for p in self.params:
            on_host = p.device.type == "cpu"
            # Master copy only where the parameter lives off the host; on CPU it is the parameter.
            master = (
                None
                if on_host
                else p.detach().to("cpu", torch.float32).pin_memory()
                if pin
                else p.detach().to("cpu", torch.float32)
            )
            zeros = lambda: torch.zeros(
                p.shape, dtype=torch.float32, pin_memory=pin and not on_host
            )
            self.state.append(
                {
                    "exp_avg": zeros(),
                    "exp_avg_sq": zeros(),
                    "master": master,
                    "copy_stream": None if on_host else torch.cuda.Stream(p.device),
                }
            )

    # --- scheduling -------------------------------------------------------------------------

    def overlap_with_backward(self) -> None:
        """Start each parameter's update as soon as backward has accumulated its gradient."""
        for i, p in enumerate(self.params):
            self._hooks.append(
                p.register_post_accumulate_grad_hook(lambda param, i=i: self._queue_param(i))
            )

    def _open_step(self) -> None:
        with self._lock:
            if not self._step_open:
                self.step_count += 1
                self._step_open = True

    def _queue_param(self, i: int) -> None:
        p = self.params[i]
        if p.grad is None:
            return  # like torch.optim.AdamW: no gradient, no update, state untouched
        self._open_step()
        with self._lock:
            if i in self._queued:
                return
            self._queued.add(i)
            # Per-parameter step count, as torch keeps it: a parameter skipped for lack of a
            # gradient keeps its own bias correction.
            self.param_steps[i] += 1
            step = self.param_steps[i]
        event = None
        if p.device.type == "cuda":  # the copy stream must see the finished gradient
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(p.device))
        n = p.numel()
        for start in range(0, n, self.chunk_elems):
            self._pending.append(
                self._pool.submit(
                    self._update_chunk, i, start, min(start + self.chunk_elems, n), step, event
                )
            )

    def step(self) -> None:
        """Queue every parameter not queued yet (all of them without overlap) and wait."""
        self.queued_during_backward = len(self._queued)  # started before step(): overlapped
        with self._lock:
            self.chunks_done_before_step = self._chunks_done  # finished while backward ran
        for i in range(len(self.params)):
            self._queue_param(i)
        for f in self._pending:
            f.result()  # re-raises a worker's exception here
        for i, p in enumerate(self.params):
            stream = self.state[i]["copy_stream"]
            if stream is not None:
                # The host must not touch a master chunk again while its H2D copy is in flight,
                # and the compute stream must see the new parameters.
                stream.synchronize()
                torch.cuda.current_stream(p.device).wait_stream(stream)
        self.chunks_total_last_step = len(self._pending)
        self._pending, self._queued, self._step_open = [], set(), False
        self._chunks_done = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._pool.shutdown(wait=True)

    # --- the update of one chunk ---------------------------------------------------------------

    def _update_chunk(self, i: int, start: int, end: int, step: int, event) -> None:
        self._update_chunk_body(i, start, end, step, event)
        with self._lock:
            self._chunks_done += 1

    def _update_chunk_body(self, i: int, start: int, end: int, step: int, event) -> None:
        p, st = self.params[i], self.state[i]
        m = st["exp_avg"].view(-1)[start:end]
        v = st["exp_avg_sq"].view(-1)[start:end]
        master_all = st["master"]
        if master_all is None:  # parameter on the host: update it in place
            param = p.detach().view(-1)[start:end]
            grad = p.grad.view(-1)[start:end]
            self._adamw(param, grad, m, v, step)
            return
        stream = st["copy_stream"]
        assert stream is not None  # a parameter off the host has a master copy and a stream
        with torch.cuda.stream(stream):
            stream.wait_event(event)
            grad = p.grad.view(-1)[start:end].to("cpu", torch.float32, non_blocking=True)
            stream.synchronize()  # the host needs the gradient chunk before updating
            master = master_all.view(-1)[start:end]
            self._adamw(master, grad, m, v, step)
            p.detach().view(-1)[start:end].copy_(master, non_blocking=True)

    def _adamw(self, param, grad, exp_avg, exp_avg_sq, step: int) -> None:
        """torch.optim.adamw single-tensor arithmetic, op for op (see module docstring)."""
        lr, (beta1, beta2), eps, wd = self.lr, self.betas, self.eps, self.weight_decay
        if wd != 0:
            param.mul_(1 - lr * wd)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        t = float(step)  # torch keeps the step in a float tensor and reads it with .item()
        bias_correction1 = 1 - beta1**t
        bias_correction2 = 1 - beta2**t
        step_size = lr / bias_correction1
        bias_correction2_sqrt = bias_correction2**0.5
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
        param.addcdiv_(exp_avg, denom, value=-step_size)

    def state_bytes(self) -> dict:
        """Host bytes held for optimizer state, and device bytes (none besides the parameters)."""
        host = 0
        for st in self.state:
            master = st["master"]
            host += st["exp_avg"].nbytes + st["exp_avg_sq"].nbytes
            host += master.nbytes if master is not None else 0
        return {"host_state_bytes": host, "device_state_bytes": 0}
