"""Piper's pipelined training executor: PP x EP (x DP) with 1F1B on torch.distributed.pipelining.

Piper Sec. III-D: "it interfaces PyTorch Distributed Pipeline Parallelism with expert-parallel
... We instrumented 1F1B schedule and installed synchronization mechanisms among expert-parallel
group members." Layout (Sec. III-A2a, Fig. 2): P = DP x PP x EP ranks on a DeviceMesh with dims
("dp", "pp", "ep"), EP innermost (Eq. 10: EP inside the fast domain). Each of the EP x DP
pipelines runs the same schedule on its own shard of the global batch; inside a stage the EP
ranks exchange tokens through the dispatcher of components/moe/moe_layer.py (``alltoall``: any
registered algorithm, flat, HALO or RBD, on the EP group), and because every pipeline executes
the same schedule, the EP group's collectives are issued in the same order on every member.

Gradient convention (what ``--check-reference`` checks): the loss of a step is the mean over the
DP x EP data shards and the M micro-batches of each micro-batch's mean token cross entropy (plus
the weighted router balance loss); replicated parameters are averaged over the EP group, expert
weights divided by EP, everything averaged over DP. :func:`reference_run` computes the same in
one process.

Measurements per step: loss, tokens/s, per-stage activation peak (Piper Eq. 4's activation term)
and static bytes, the bubble of the critical stage (stage imbalance reported beside it), the time
split and MFU (Piper Eq. 12) against the GEMM peak measured on the device.

Why: Piper's planner predicts memory and step time for PP x EP layouts; this executor runs them.
The layout, the convention and the measurements in full: see docs/pp-ep-trainer.md.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from moe_repro.runtime.device import bind
from moe_repro.runtime.timing import peak_memory_bytes, timer_for
from moe_repro.components.alltoall import algorithm_names, get_algorithm
from moe_repro.components.model.moe_transformer import (
    RegionClock,
    StageModule,
    TransformerConfig,
    expert_owner,
    expert_param_names,
    lm_loss,
)
from moe_repro.components.model.pipeline_split import stage_layers
from moe_repro.components.training.text_data import BYTE_VOCAB, global_batch

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import (
        PipelineScheduleMulti,
        PipelineScheduleSingle,
    )

SCHEDULES = ("1f1b", "gpipe", "interleaved")


@dataclass
class TrainConfig:
    model: str = "tiny-moe"
    pp: int = 1
    ep: int = 1
    dp: int = 1
    schedule: str = "1f1b"
    micro_batches: int = 4
    micro_batch_size: int = 2  # sequences per micro-batch per pipeline
    steps: int = 4
    seq_len: int | None = None  # None: the zoo's default for the model
    n_layers: int | None = None  # None: the zoo's layer count
    virtual_stages: int = 2  # stages per rank for the interleaved schedule
    lr: float = 1e-3
    aux_loss_coef: float = 0.01
    seed: int = 0
    checkpoint: bool = False  # activation checkpointing of every block
    alltoall: str = "flat"  # the dispatcher inside each EP group: a registered all-to-all
    ranks_per_node: int | None = None  # emulated node size of a local launch (None: one node)
    check_reference: bool = False
    # Fault injection (tests, drills): rank ``fail_rank`` dies abruptly at step ``fail_step``.
    fail_rank: int = -1
    fail_step: int = 0

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.ep

    @property
    def stages_per_rank(self) -> int:
        return self.virtual_stages if self.schedule == "interleaved" else 1

    def model_config(self) -> TransformerConfig:
        return TransformerConfig.from_zoo(
            self.model,
            seq_len=self.seq_len,
            n_layers=self.n_layers,
            aux_loss_coef=self.aux_loss_coef,
        )

    def validate(self) -> None:
        """Raise ValueError for a configuration that cannot run (Piper Eq. 8-9 and schedules)."""
        for name in (
            "pp",
            "ep",
            "dp",
            "micro_batches",
            "micro_batch_size",
            "steps",
            "virtual_stages",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("seq_len", "n_layers"):  # None: the zoo's value
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(
                    f"{name} must be >= 1 (or left out for the model's own), got {getattr(self, name)}"
                )
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr}")
        if not (math.isfinite(self.aux_loss_coef) and self.aux_loss_coef >= 0):
            raise ValueError(
                f"aux_loss_coef must be a finite number >= 0, got {self.aux_loss_coef}"
            )
        if self.alltoall not in algorithm_names():  # every registered dispatcher trains
            raise ValueError(
                f"alltoall must be one of {', '.join(algorithm_names())}, got {self.alltoall!r}"
            )
        if self.ranks_per_node is not None and (
            self.ranks_per_node < 1 or self.world_size % self.ranks_per_node
        ):
            raise ValueError(
                f"ranks_per_node={self.ranks_per_node} must divide the {self.world_size} ranks"
            )
        algorithm = get_algorithm(self.alltoall)
        if algorithm.facts.equal_ranks_per_node:  # e.g. HALO: Alg. 1 pairs equal local ranks
            from moe_repro.components.network.topology import Topology

            per = self.ranks_per_node or self.world_size
            topo = Topology(nodes=self.world_size // per, ranks_per_node=per)
            for first in range(0, self.world_size, self.ep):  # EP is the mesh's innermost dim
                algorithm.check_group(list(range(first, first + self.ep)), topo)
        if self.schedule not in SCHEDULES:
            raise ValueError(
                f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}"
            )
        m = self.model_config()
        if m.vocab < BYTE_VOCAB:
            raise ValueError(f"model vocab {m.vocab} < {BYTE_VOCAB}: cannot read byte-level text")
        if m.n_experts % self.ep:
            raise ValueError(f"EP={self.ep} must divide the {m.n_experts} experts (Piper Eq. 8)")
        n_stages = self.pp * self.stages_per_rank
        if n_stages > m.n_layers:
            raise ValueError(
                f"{n_stages} pipeline stages need >= {n_stages} layers, model has "
                f"{m.n_layers} (Piper Eq. 9)"
            )
        if self.schedule == "1f1b" and self.micro_batches < self.pp:
            raise ValueError(f"1F1B needs micro_batches >= pp ({self.micro_batches} < {self.pp})")
        if self.schedule == "interleaved":
            if self.virtual_stages < 2:
                raise ValueError("interleaved needs virtual_stages >= 2")
            rounds = max(1, self.micro_batches // self.pp)
            if self.micro_batches % rounds:
                raise ValueError(
                    f"interleaved 1F1B needs micro_batches a multiple of "
                    f"{rounds} (torch's flexible rounds), got {self.micro_batches}"
                )

    def static_bytes_per_rank(self) -> float:
        """Weights + grads + Adam m, v in fp32 (16 B/param) of the largest stage's rank."""
        m = self.model_config()
        per_layer = (
            4 * m.d_model**2
            + m.d_model * m.n_experts
            + 3 * m.n_experts // self.ep * m.d_model * m.d_ffn
        )
        layers = -(-m.n_layers // (self.pp * self.stages_per_rank)) * self.stages_per_rank
        return 16.0 * (layers * per_layer + m.vocab * m.d_model)

    def theoretical_bubble(self) -> float:
        """Idle fraction of a step with equal stages: (PP-1)/(M+PP-1) (Piper III-D, GPipe, 1F1B);
        interleaving with v stages per rank shrinks the bubble v-fold: (PP-1)/(vM+PP-1)."""
        v = self.stages_per_rank
        return (self.pp - 1) / (v * self.micro_batches + self.pp - 1)


# --- activation memory: bytes held by autograd for backward -------------------------------------


class SavedActivationMeter:
    """Live and peak bytes of tensors autograd saves for backward (parameters excluded).

    Storages are counted once however many views are saved; a storage stops counting when the
    last saved reference to it is released (after its backward). This is the activation term of
    Piper Eq. 4 as the framework actually holds it, on any device."""

    def __init__(self, params):
        self.param_ptrs = {p.untyped_storage().data_ptr() for p in params}
        self.refs: dict[int, list[int]] = {}
        self.live = 0
        self.peak = 0
        self.in_flight = 0  # micro-batches whose forward started and backward has not finished
        self.in_flight_at_peak = 0

    def pack(self, t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr in self.param_ptrs or ptr == 0:
            return t
        return _Held(self, t, ptr)

    @staticmethod
    def unpack(h):
        return h.tensor if isinstance(h, _Held) else h

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


class _Held:
    def __init__(self, meter: SavedActivationMeter, tensor: torch.Tensor, ptr: int):
        self.meter, self.tensor, self.ptr = meter, tensor, ptr
        entry = meter.refs.get(ptr)
        if entry is None:
            nbytes = tensor.untyped_storage().nbytes()
            meter.refs[ptr] = [nbytes, 1]
            meter.live += nbytes
            if meter.live > meter.peak:
                meter.peak = meter.live
                meter.in_flight_at_peak = meter.in_flight
        else:
            entry[1] += 1

    def __del__(self):
        entry = self.meter.refs.get(self.ptr)
        if entry is not None:
            entry[1] -= 1
            if entry[1] == 0:
                del self.meter.refs[self.ptr]
                self.meter.live -= entry[0]


# --- building one rank's part -------------------------------------------------------------------


@dataclass
class RankState:
    cfg: TrainConfig
    model_cfg: TransformerConfig
    mesh: DeviceMesh
    coords: dict
    groups: dict
    modules: list[StageModule]
    stages: list[PipelineStage]
    schedule: PipelineScheduleSingle | PipelineScheduleMulti
    optimizer: torch.optim.Optimizer
    device: torch.device


def build_rank(cfg: TrainConfig, device: torch.device) -> RankState:
    """DeviceMesh, this rank's stage module(s), PipelineStage(s), schedule, optimizer."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    cfg.validate()
    mc = cfg.model_config()
    if dist.get_world_size() != cfg.world_size:
        raise ValueError(
            f"world has {dist.get_world_size()} ranks, dp x pp x ep = {cfg.world_size}"
        )
    mesh = init_device_mesh(
        device.type, (cfg.dp, cfg.pp, cfg.ep), mesh_dim_names=("dp", "pp", "ep")
    )
    coordinate = mesh.get_coordinate()
    assert coordinate is not None  # every rank of the world is in the mesh
    dp_rank, pp_rank, ep_rank = coordinate
    groups = {d: mesh.get_group(d) for d in ("dp", "pp", "ep")}
    n_stages = cfg.pp * cfg.stages_per_rank
    layers = stage_layers(mc.n_layers, n_stages)
    stage_ids = [pp_rank + v * cfg.pp for v in range(cfg.stages_per_rank)]  # looped placement
    modules = [
        StageModule(
            mc,
            list(layers[s]),
            s == 0,
            s == n_stages - 1,
            cfg.ep,
            ep_rank,
            groups["ep"],
            seed=cfg.seed,
            checkpoint=cfg.checkpoint,
            all_to_all=cfg.alltoall,
        ).to(device)
        for s in stage_ids
    ]
    stages = [
        PipelineStage(m, s, n_stages, device, group=groups["pp"])
        for m, s in zip(modules, stage_ids)
    ]
    schedule: PipelineScheduleSingle | PipelineScheduleMulti
    if cfg.schedule == "interleaved":
        schedule = ScheduleInterleaved1F1B(
            # torch annotates the stages as an invariant list of its private base class
            stages,  # type: ignore[arg-type]
            cfg.micro_batches,
            loss_fn=lm_loss,
            scale_grads=True,
        )
    else:
        kind = Schedule1F1B if cfg.schedule == "1f1b" else ScheduleGPipe
        schedule = kind(stages[0], cfg.micro_batches, loss_fn=lm_loss, scale_grads=True)
    params = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, foreach=False)
    coords = {"dp": dp_rank, "pp": pp_rank, "ep": ep_rank, "stages": stage_ids}
    return RankState(cfg, mc, mesh, coords, groups, modules, stages, schedule, optimizer, device)


def _all_reduce_mean(grads: list[torch.Tensor], group, size: int) -> None:
    """One coalesced all-reduce of ``grads`` over ``group``, then / size."""
    if not grads or size == 1:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat.div_(size)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def sync_gradients(state: RankState) -> None:
    """The EP-group synchronisation Piper installs (Sec. III-D), plus DP averaging."""
    cfg = state.cfg
    replicated: list[torch.Tensor] = []
    experts: list[torch.Tensor] = []
    for m in state.modules:
        expert_names = expert_param_names(m)
        for name, p in m.named_parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            (experts if name in expert_names else replicated).append(p.grad)
    _all_reduce_mean(replicated, state.groups["ep"], cfg.ep)
    for g in experts:  # each already summed the gradient of every EP shard's tokens
        g.div_(cfg.ep)
    _all_reduce_mean(replicated + experts, state.groups["dp"], cfg.dp)


def _shard_batch(cfg: TrainConfig, mc: TransformerConfig, step: int, shard: int):
    rows = cfg.micro_batches * cfg.micro_batch_size
    tokens = global_batch(cfg.seed, step, cfg.dp * cfg.ep * rows, mc.seq_len)
    mine = tokens[shard * rows : (shard + 1) * rows]
    return mine[:, :-1].contiguous(), mine[:, 1:].contiguous()


class _BusyTimer:
    """Wraps this rank's stage compute (forward, backward, loss) to time it (busy seconds), and
    records the saved-activation bytes each micro-batch's forward (+ loss) adds."""

    def __init__(self, state: RankState, clock: RegionClock, meter: "SavedActivationMeter"):
        self.seconds = 0.0
        self.clock, self.meter = clock, meter
        self.forward_bytes: list[int] = []
        # torch's stage and schedule methods are replaced by timed wrappers of themselves
        for stage in state.stages:
            stage.forward_one_chunk = self._wrap(  # type: ignore[method-assign]
                stage.forward_one_chunk, new_entry=True
            )
            stage.backward_one_chunk = self._wrap(  # type: ignore[method-assign]
                stage.backward_one_chunk
            )
        sched = state.schedule
        sched._compute_loss = self._wrap(  # type: ignore[method-assign]
            sched._compute_loss, add_to_last=True
        )

    def _wrap(self, fn, new_entry: bool = False, add_to_last: bool = False):
        is_backward = not (new_entry or add_to_last)

        def timed(*args, **kwargs):
            start, live = self.clock.now(), self.meter.live
            if new_entry:
                self.meter.in_flight += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += self.clock.now() - start
                if new_entry:
                    self.forward_bytes.append(self.meter.live - live)
                elif add_to_last and self.forward_bytes:
                    self.forward_bytes[-1] += self.meter.live - live
                elif is_backward:
                    self.meter.in_flight -= 1

        return timed


def _p2p_seconds_per_message(state: RankState, shape: tuple[int, ...], repeats: int = 5) -> float:
    """One-way time of one activation message between neighbouring stages (median of ping-pongs).

    Every PP group runs the same pairs in the same order; 0 when PP = 1."""
    cfg = state.cfg
    if cfg.pp == 1:
        return 0.0
    group = state.groups["pp"]
    me = state.coords["pp"]
    buf = torch.zeros(shape, device=state.device)
    times = []
    timer = timer_for(state.device)  # CUDA events under nccl (runtime/timing.py)
    for left in range(cfg.pp - 1):
        if me not in (left, left + 1):
            continue
        peer = dist.get_global_rank(group, left + 1 if me == left else left)
        for _ in range(repeats + 1):
            timer.start()
            if me == left:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
            times.append(timer.stop() / 2)
    return statistics.median(times[1:]) if len(times) > 1 else 0.0


def _gemm_peak_flops(device: torch.device, n: int = 384, repeats: int = 5) -> float:
    """Measured fp32 GEMM rate (FLOP/s) of one rank: the peak MFU is measured against."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    best = math.inf
    timer = timer_for(device)  # CUDA events on a GPU (runtime/timing.py)
    for _ in range(repeats):
        timer.start()
        for _ in range(4):
            a @ b
        best = min(best, timer.stop() / 4)
    return 2.0 * n**3 / best


def named_grads(state: RankState) -> dict[str, tuple[int, torch.Tensor]]:
    """Name -> (first global expert index or -1, gradient copy)."""
    out = {}
    for m in state.modules:
        expert_names = expert_param_names(m)
        for name, p in m.named_parameters():
            first = expert_owner(m, name).first_expert if name in expert_names else -1
            out[name] = (first, _grad(p).detach().clone())
    return out


class StepRunner:
    """Runs training steps of one rank's part and records per-step measurements."""

    def __init__(self, state: RankState):
        self.state = state
        cfg = state.cfg
        self.shard = state.coords["dp"] * cfg.ep + state.coords["ep"]
        self.has_first = any(s.is_first for s in state.stages)
        self.has_last = any(s.is_last for s in state.stages)
        self.clock = RegionClock(device=state.device)
        for m in state.modules:
            m.set_clock(self.clock)
        self.meter = SavedActivationMeter([p for m in state.modules for p in m.parameters()])
        self.busy = _BusyTimer(state, self.clock, self.meter)

    def step(self, step: int, optimizer_step: bool = True) -> dict:
        """Forward/backward of M micro-batches by the schedule, gradient sync, optimizer step."""
        state, cfg, clock = self.state, self.state.cfg, self.clock
        x, y = _shard_batch(cfg, state.model_cfg, step, self.shard)
        x, y = x.to(state.device), y.to(state.device)
        state.optimizer.zero_grad(set_to_none=True)
        clock.reset()
        self.busy.seconds = 0.0
        self.busy.forward_bytes = []
        self.meter.peak = self.meter.live
        self.meter.in_flight = self.meter.in_flight_at_peak = 0
        losses: list[torch.Tensor] = []
        args = (x,) if self.has_first else ()
        dist.barrier()
        t0 = clock.now()
        with self.meter.hooks():
            state.schedule.step(
                *args, target=y if self.has_last else None, losses=losses, return_outputs=False
            )
        t_sched = clock.now() - t0
        sync_gradients(state)
        t_sync = clock.now() - t0 - t_sched
        if optimizer_step:
            state.optimizer.step()
        t_step = clock.now() - t0
        # Mean loss over micro-batches and shards, known to every rank.
        loss_sum = torch.tensor(
            [float(sum(l.item() for l in losses)) if self.has_last else 0.0],
            dtype=torch.float64,
            device=state.device,
        )  # NCCL: on the GPU
        dist.all_reduce(loss_sum)
        return {
            "loss": loss_sum.item() / (cfg.micro_batches * cfg.dp * cfg.ep),
            "step_s": t_step,
            "schedule_s": t_sched,
            "sync_s": t_sync,
            "busy_s": self.busy.seconds,
            "activation_peak_bytes": self.meter.peak,
            "activation_per_microbatch_bytes": statistics.mean(self.busy.forward_bytes),
            "in_flight_at_peak": self.meter.in_flight_at_peak,
            **{f"{k}_s": v for k, v in clock.seconds.items()},
        }


def train_rank(ctx, **config) -> dict:
    """``run_ranks`` target: train ``steps`` steps on this rank; rank 0's result has the report."""
    cfg = TrainConfig(**config)
    device = (
        ctx.device
    )  # the runtime's rule (runtime/device.py): cuda:LOCAL_RANK under nccl, else cpu
    bind(device)
    torch.manual_seed(cfg.seed)
    state = build_rank(cfg, device)
    mc = state.model_cfg
    runner = StepRunner(state)
    per_step, grads_per_step = [], []
    for step in range(cfg.steps):
        if ctx.rank == cfg.fail_rank and step == cfg.fail_step:
            import os

            os._exit(3)  # as a crashed process would: no cleanup, peers stuck in collectives
        per_step.append(runner.step(step, optimizer_step=not cfg.check_reference))
        if cfg.check_reference:  # gradients before the update, then the update
            grads_per_step.append(named_grads(state))
            state.optimizer.step()

    act_shape = (cfg.micro_batch_size, mc.seq_len, mc.d_model)
    p2p_msg_s = _p2p_seconds_per_message(state, act_shape)
    peak_flops = _gemm_peak_flops(device)
    result = _rank_summary(state, per_step, p2p_msg_s, peak_flops)

    gathered: list[Any] | None = [None] * dist.get_world_size() if ctx.rank == 0 else None
    dist.gather_object(result, gathered, dst=0)
    if cfg.check_reference:
        diffs = _compare_with_reference(state, grads_per_step, ctx.rank == 0)
    if ctx.rank != 0 or gathered is None:
        return {"rank": ctx.rank}
    report = summarize(cfg, mc, gathered, device)
    report["clock"] = runner.clock.clock  # what timed the steps and regions (runtime/timing.py)
    if cfg.check_reference:
        report.update(diffs)
        loss_diff = max(abs(a - b) for a, b in zip(report["losses"], diffs["reference_losses"]))
        report["reference_max_abs_diff_losses"] = loss_diff
        report["reference_max_abs_diff"] = max(loss_diff, diffs["reference_max_abs_diff_grads"])
    return report


def _rank_summary(
    state: RankState, per_step: list[dict], p2p_msg_s: float, peak_flops: float
) -> dict:
    cfg = state.cfg
    static_bytes = sum(
        4 * p.numel() * p.element_size() for m in state.modules for p in m.parameters()
    )  # weight, grad, Adam m and v
    n_neighbours = sum(1 for s in state.stages if not s.is_first) + sum(
        1 for s in state.stages if not s.is_last
    )
    p2p_messages = 2 * cfg.micro_batches * n_neighbours  # activations and their gradients
    cuda_peak = peak_memory_bytes(state.device)  # allocator high-water mark (GPU runs; None on CPU)
    return {
        "coords": state.coords,
        "per_step": per_step,
        "static_bytes": static_bytes,
        "cuda_max_allocated_bytes": cuda_peak,
        "p2p_s_per_step": p2p_msg_s * p2p_messages,
        "peak_flops": peak_flops,
    }


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def summarize(cfg: TrainConfig, mc: TransformerConfig, ranks: list[dict], device) -> dict:
    """Rank 0's report from every rank's per-step numbers (steps after the first when > 1:
    the first step includes the schedule's shape exchange)."""
    timed = slice(1, None) if cfg.steps > 1 else slice(0, None)
    losses = [s["loss"] for s in ranks[0]["per_step"]]
    tokens_per_step = cfg.dp * cfg.ep * cfg.micro_batches * cfg.micro_batch_size * mc.seq_len
    step_s = [max(r["per_step"][i]["step_s"] for r in ranks) for i in range(cfg.steps)][timed]
    step_med = _median(step_s)
    per_rank = []
    for r in ranks:
        steps = r["per_step"][timed]
        sched = _median([s["schedule_s"] for s in steps])
        busy = _median([s["busy_s"] for s in steps])
        split = {
            k: _median([s.get(f"{k}_s", 0.0) for s in steps])
            for k in ("attention", "experts", "alltoall")
        }
        p2p = min(r["p2p_s_per_step"], max(0.0, sched - busy))
        split["p2p"] = p2p
        split["idle"] = max(0.0, sched - busy - p2p)
        split["other"] = max(0.0, busy - split["attention"] - split["experts"] - split["alltoall"])
        split["grad_sync"] = _median([s["sync_s"] for s in steps])
        per_rank.append(
            {
                **r["coords"],
                "idle_fraction": 1.0 - busy / sched if sched > 0 else 0.0,
                "time_split_s": split,
                "static_bytes": r["static_bytes"],
                "activation_peak_bytes": max(s["activation_peak_bytes"] for s in r["per_step"]),
                "activation_per_microbatch_bytes": max(
                    s["activation_per_microbatch_bytes"] for s in r["per_step"]
                ),
                "in_flight_at_peak": max(s["in_flight_at_peak"] for s in r["per_step"]),
            }
        )
    per_stage = []
    for p in range(cfg.pp):
        mine = [r for r in per_rank if r["pp"] == p]
        act = max(r["activation_peak_bytes"] for r in mine)
        static = max(r["static_bytes"] for r in mine)
        per_mb = max(r["activation_per_microbatch_bytes"] for r in mine)
        cuda_peaks = [
            r["cuda_max_allocated_bytes"]
            for r in ranks
            if r["coords"]["pp"] == p and r["cuda_max_allocated_bytes"] is not None
        ]
        per_stage.append(
            {
                "pp_rank": p,
                "stages": mine[0]["stages"],
                "cuda_max_allocated_bytes": max(cuda_peaks) if cuda_peaks else None,
                "activation_peak_bytes": act,
                "static_bytes": static,
                "activation_per_microbatch_bytes": per_mb,
                "peak_over_mean_microbatch": act / per_mb if per_mb else float("nan"),
                "in_flight_at_peak": max(r["in_flight_at_peak"] for r in mine),
                "peak_bytes": act + static,
                "idle_fraction": statistics.mean(r["idle_fraction"] for r in mine),
            }
        )
    split_mean = {
        k: statistics.mean(r["time_split_s"][k] for r in per_rank)
        for k in per_rank[0]["time_split_s"]
    }
    flops = mc.train_flops_per_token() * tokens_per_step
    peak_total = sum(r["peak_flops"] for r in ranks)
    return {
        "config": asdict(cfg),
        "model_config": asdict(mc),
        "world_size": cfg.world_size,
        "device": str(device.type),
        "backend": dist.get_backend(),
        "losses": losses,
        "tokens_per_step": tokens_per_step,
        "step_s": step_med,
        "step_s_all": step_s,
        "tokens_per_s": tokens_per_step / step_med,
        # Per step: the schedule lasts T = max over ranks; the critical stage computes for
        # max busy; everything else on it is bubble: 1 - max busy / T (median over steps).
        "bubble_measured": _median(
            [
                1.0
                - max(r["per_step"][i]["busy_s"] for r in ranks)
                / max(r["per_step"][i]["schedule_s"] for r in ranks)
                for i in range(cfg.steps)
            ][timed]
        ),
        "idle_fraction_mean": statistics.mean(s["idle_fraction"] for s in per_stage),
        "bubble_theory": cfg.theoretical_bubble(),
        "per_stage": per_stage,
        "per_rank": per_rank,
        "time_split_s": split_mean,
        "model_flops_per_step": flops,
        "achieved_flops": flops / step_med,
        "device_peak_flops": peak_total,
        "mfu": flops / step_med / peak_total,
        "mfu_note": "peak = fp32 GEMM rate measured on every rank at the same time, summed",
    }


# --- the single-process reference ---------------------------------------------------------------


def reference_run(cfg: TrainConfig) -> dict:
    """The same steps in one process: whole model, no pipeline, no EP, same data and convention.

    Returns {"losses": [...], "grads": [{name: tensor}] per step (before the optimizer step)}."""
    mc = cfg.model_config()
    model = StageModule(mc, list(range(mc.n_layers)), True, True, seed=cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, foreach=False)
    n_shards, m = cfg.dp * cfg.ep, cfg.micro_batches
    losses, grads = [], []
    for step in range(cfg.steps):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for shard in range(n_shards):
            x, y = _shard_batch(cfg, mc, step, shard)
            for xb, yb in zip(x.chunk(m), y.chunk(m)):
                loss = lm_loss(model(xb), yb)
                loss.backward()  # unscaled, as the schedule does per micro-batch
                total += loss.item()
        for p in model.parameters():
            _grad(p).div_(n_shards * m)
        grads.append({n: _grad(p).detach().clone() for n, p in model.named_parameters()})
        optimizer.step()
        losses.append(total / (n_shards * m))
    return {"losses": losses, "grads": grads}


def _grad(p: torch.Tensor) -> torch.Tensor:
    """A parameter's gradient, which every parameter has after the reference's backward."""
    assert p.grad is not None
    return p.grad


def _compare_with_reference(state: RankState, grads_per_step: list[dict], is_root: bool) -> dict:
    """Gather every rank's gradients on rank 0 and compare with :func:`reference_run`."""
    gathered: list[Any] | None = [None] * dist.get_world_size() if is_root else None
    dist.gather_object(grads_per_step, gathered, dst=0)
    if not is_root or gathered is None:
        return {}
    ref = reference_run(state.cfg)
    worst, worst_name = 0.0, None
    for rank_steps in gathered:
        for step, named in enumerate(rank_steps):
            for name, (first, g) in named.items():
                r = ref["grads"][step][name]
                if first >= 0:
                    r = r[first : first + g.shape[0]]
                d = (g.cpu() - r).abs().max().item() if g.numel() else 0.0
                if d > worst:
                    worst, worst_name = d, name
    return {
        "reference_losses": ref["losses"],
        "reference_max_abs_diff_grads": worst,
        "reference_worst_param": worst_name,
    }


def launch_training(cfg: TrainConfig, timeout_s: float = 600.0, backend: str = "auto") -> dict:
    """Start dp x pp x ep real ranks on this machine and return rank 0's report; ``auto``: nccl
    when every rank sees a GPU of its own, else gloo (runtime/device.py).

    A rank that dies makes the launcher kill the others at once (moe_repro.runtime.launch.run_ranks);
    a hung world is killed after ``timeout_s``: either way RankFailure names the ranks."""
    from moe_repro.runtime.launch import run_ranks

    from moe_repro.runtime.device import auto_backend

    cfg.validate()
    if backend == "auto":
        backend = auto_backend(cfg.ranks_per_node or cfg.world_size)[0] or "gloo"
    results = run_ranks(
        "moe_repro.components.training.pp_ep_trainer:train_rank",
        asdict(cfg),
        world_size=cfg.world_size,
        ranks_per_node=cfg.ranks_per_node,
        backend=backend,
        timeout_s=timeout_s,
    )
    return results[0]
