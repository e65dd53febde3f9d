"""Shipping whole experts between EP ranks, differentiably, and running an FFN on given weights.

Used by the balancers that compute an expert on a rank other than its home (FEPLB Phase 2,
least-loaded EP, FasterMoE shadows). One expert's weights travel as one flat row
[w_in | w_gate | w_out] (n_mat * H * F values). The forward copy is an all-to-all-v issued
*asynchronously* on its own process group (on CPU gloo runs it on its own worker thread; with
NCCL a separate group runs on its own CUDA stream, FEPLB's copy-engine path), so the caller can
compute its static experts meanwhile and ``wait()`` before the dynamic ones. Gradients of a
copy flow back to the home rank's parameters: the backward is the reverse all-to-all-v on the
same group, so the home expert's gradient is the sum over every rank that computed it, exactly
as if it had computed all those rows itself.

Bytes per copied expert: n_mat * H * F * itemsize (forward) and the same for its gradient.

The copy-engine path (FEPLB Sec. 2: weights copied "asynchronously ... as the static experts
compute"). On CUDA the copy is issued from its own CUDA stream, after an event that says the
packed weights are ready; NCCL runs it on the group's communication stream, the copy stream
waits for it, and an event at its end is what the compute stream waits on before the dynamic
experts (``wait``). On the CPU the same code path runs the copy on gloo's worker thread (there
is no copy engine: the copy competes with the compute for cores), and says so.

Measured overlap (:meth:`ExpertCopy.overlap`): copy time (issue to completion), the static
experts' compute time (between :meth:`ExpertCopy.compute_started` and
:meth:`ExpertCopy.compute_finished`), and the hidden part, the length of their intersection.
CUDA: events on the copy and compute streams (read after they complete); CPU: host clock stamps
at issue, at the worker's completion callback and around the (synchronous) compute.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from moe_repro.runtime.timing import host_seconds

from moe_repro.components.network.comm import TorchComm
from moe_repro.components.moe.expert_mlp import ExpertMLP, grouped_gemm


def expert_matrices(mlp: ExpertMLP) -> list[torch.Tensor]:
    return [p for p in (mlp.w_in, mlp.w_gate, mlp.w_out) if p is not None]


def pack_experts(mlp: ExpertMLP, local_slots: list[int]) -> torch.Tensor:
    """[len(slots), n_mat * H * F] rows of the given local experts (differentiable)."""
    # index_select even for no slots: the (empty) result stays attached to the parameters, so
    # every rank takes part in the copy's backward collective.
    mats = expert_matrices(mlp)
    idx = torch.tensor(local_slots, dtype=torch.int64, device=mats[0].device)
    return torch.cat(
        [m.index_select(0, idx).reshape(len(local_slots), _matrix_numel(m)) for m in mats], dim=1
    )


def _matrix_numel(m: torch.Tensor) -> int:
    n = 1
    for d in m.shape[1:]:
        n *= d
    return n


def unpack_experts(mlp: ExpertMLP, rows: torch.Tensor) -> list[torch.Tensor]:
    """Inverse of pack_experts: per-matrix stacks [n, *matrix shape]."""
    out, start = [], 0
    for m in expert_matrices(mlp):
        size = _matrix_numel(m)
        out.append(rows[:, start : start + size].reshape(rows.shape[0], *m.shape[1:]))
        start += size
    return out


def local_stacks(mlp: ExpertMLP, local_slots: list[int]) -> list[torch.Tensor]:
    """Per-matrix stacks of the given local experts (differentiable index_select)."""
    idx = torch.tensor(local_slots, dtype=torch.int64, device=mlp.w_in.device)
    return [m.index_select(0, idx) for m in expert_matrices(mlp)]


def ffn_with_weights(
    mlp: ExpertMLP,
    x: torch.Tensor,
    tokens_per_group,
    stacks: list[torch.Tensor],
    gemm: str | None = None,
) -> torch.Tensor:
    """The same FFN as ``mlp.forward`` on rows grouped by expert, with the given weight stacks."""
    variant = gemm or mlp.gemm
    counts = torch.as_tensor(tokens_per_group, dtype=torch.int64)
    if counts.numel() == 0:
        # No groups: an empty result that still depends on the (empty) weights and rows, so the
        # collectives behind them run their backward on this rank like on the others.
        anchor = sum(w.sum() for w in stacks) * 0 + x.sum() * 0
        return x.new_zeros(0, mlp.d_model) + anchor
    if mlp.w_gate is not None:
        w_in, w_gate, w_out = stacks
        gate = grouped_gemm(x, w_gate, counts, variant)
    else:
        (w_in, w_out), gate = stacks, None
    up = grouped_gemm(x, w_in, counts, variant)
    return grouped_gemm(mlp.hidden_activation(up, gate), w_out, counts, variant)


class _AttachCopyGrad(torch.autograd.Function):
    """Identity from ``sent`` to the already-received rows; backward returns the gradient of
    the received rows to their senders with the reverse all-to-all-v on the copy group."""

    @staticmethod
    def forward(ctx, sent, received, send_counts, recv_counts, comm):
        ctx.send_counts, ctx.recv_counts, ctx.comm = send_counts, recv_counts, comm
        return received.view_as(received)

    @staticmethod
    def backward(ctx, grad):
        back = ctx.comm.alltoallv(
            grad.contiguous(), ctx.recv_counts, ctx.send_counts, "expert_copy"
        )
        return back, None, None, None, None


CUDA_PATH = "CUDA copy stream (NCCL), ordered by events against the static experts' compute"
CPU_PATH = "gloo worker thread (CPU: no copy engine; the copy shares the cores with the compute)"


@dataclass(frozen=True)
class CopyOverlap:
    """How much of one expert copy the static experts' compute hid."""

    path: str  # CUDA_PATH or CPU_PATH: where the copy ran
    clock: str  # what timed it
    copy_s: float  # issue to completion
    compute_s: float  # the static experts' compute
    hidden_s: float  # the part of the copy during the compute

    @property
    def hidden_fraction(self) -> float:
        return self.hidden_s / self.copy_s if self.copy_s > 0 else 1.0


_COPY_STREAMS: dict = {}  # one copy stream per CUDA device, reused by every layer


def _copy_stream(device: torch.device):
    key = device.index if device.index is not None else torch.cuda.current_device()
    if key not in _COPY_STREAMS:
        _COPY_STREAMS[key] = torch.cuda.Stream(device)
    return _COPY_STREAMS[key]


class ExpertCopy:
    """One asynchronous, differentiable all-to-all-v of packed expert rows on ``group``, on the
    copy-engine path (module docstring), with its overlap against the static compute measured.
    The copy runs on the group's communicator (network/comm.py), like every all-to-all-v."""

    def __init__(self, sent: torch.Tensor, send_counts: list[int], recv_counts: list[int], group):
        self.sent, self.send_counts, self.recv_counts, self.group = (
            sent,
            list(send_counts),
            list(recv_counts),
            group,
        )
        self.comm = TorchComm.of_group(group)
        self.received = sent.new_empty(sum(recv_counts), sent.shape[1])
        payload = sent.detach().contiguous()
        self.on_cuda = sent.device.type == "cuda"
        self._marked: set[str] = set()
        if self.on_cuda:
            self._events = {
                k: torch.cuda.Event(enable_timing=True)
                for k in ("copy_start", "copy_end", "compute_start", "compute_end")
            }
            compute = torch.cuda.current_stream(sent.device)
            self.stream = _copy_stream(sent.device)
            self.stream.wait_stream(compute)  # the packed weights are ready
            with torch.cuda.stream(self.stream):
                self._events["copy_start"].record(self.stream)
                _, self.work = self.comm.alltoallv_async(
                    payload, self.send_counts, self.recv_counts, "expert_copy", out=self.received
                )
                self.work.wait()  # the copy stream (not the host) waits for NCCL's stream
                self._events["copy_end"].record(self.stream)
            # buffers used on the copy stream stay allocated until its work is done
            payload.record_stream(self.stream)
            self.received.record_stream(self.stream)
        else:
            self._stamps: dict[str, float] = {"copy_start": host_seconds()}
            self._lock = threading.Lock()
            _, self.work = self.comm.alltoallv_async(
                payload, self.send_counts, self.recv_counts, "expert_copy", out=self.received
            )
            try:  # stamped by the worker thread the moment the copy completes
                self.work.add_done_callback(lambda: self._stamp("copy_end"))
            except (RuntimeError, AttributeError):
                pass  # no future for this op: wait() stamps when it sees the copy done
        self._payload = payload

    def _stamp(self, key: str) -> None:
        with self._lock:
            self._stamps.setdefault(key, host_seconds())  # the first stamp is the earliest

    def compute_started(self) -> None:
        """The static experts' compute starts now (on the compute stream, on CUDA)."""
        if self.on_cuda:
            self._events["compute_start"].record(torch.cuda.current_stream(self.sent.device))
            self._marked.add("compute_start")
        else:
            self._stamp("compute_start")

    def compute_finished(self) -> None:
        if self.on_cuda:
            self._events["compute_end"].record(torch.cuda.current_stream(self.sent.device))
            self._marked.add("compute_end")
        else:
            self._stamp("compute_end")

    def wait(self) -> torch.Tensor:
        if self.on_cuda:  # the compute stream waits for the copy's end event; the host does not
            torch.cuda.current_stream(self.sent.device).wait_event(self._events["copy_end"])
        else:
            self.work.wait()
            self._stamp("copy_end")
        if not (self.sent.requires_grad and torch.is_grad_enabled()):
            return self.received
        return _AttachCopyGrad.apply(
            self.sent, self.received, self.send_counts, self.recv_counts, self.comm
        )

    def overlap(self) -> CopyOverlap | None:
        """The measured overlap (None if compute_started/finished were not called). On CUDA
        this waits for the events (call it after the step, not inside it)."""
        if self.on_cuda:
            ev = self._events
            if not {"compute_start", "compute_end"} <= self._marked:
                return None
            ev["copy_end"].synchronize()
            ev["compute_end"].synchronize()
            ref = ev["copy_start"]
            t = {k: ref.elapsed_time(e) / 1e3 if k != "copy_start" else 0.0 for k, e in ev.items()}
            clock = "cuda events"
        else:
            with self._lock:
                t = dict(self._stamps)
            if "compute_start" not in t or "compute_end" not in t:
                return None
            clock = "host perf_counter"
        return overlap_of(t, CUDA_PATH if self.on_cuda else CPU_PATH, clock)


def overlap_of(t: dict[str, float], path: str, clock: str) -> CopyOverlap:
    """Copy, compute and hidden seconds from the four time stamps (one clock, any origin): the
    hidden part is the length of the intersection of [copy_start, copy_end] and
    [compute_start, compute_end]."""
    hidden = max(
        0.0, min(t["copy_end"], t["compute_end"]) - max(t["copy_start"], t["compute_start"])
    )
    return CopyOverlap(
        path=path,
        clock=clock,
        copy_s=t["copy_end"] - t["copy_start"],
        compute_s=t["compute_end"] - t["compute_start"],
        hidden_s=hidden,
    )
