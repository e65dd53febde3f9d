"""The flow engine as it was before it was vectorised: one progressive-filling pass per event,
built from Python dicts, the global minimum fixed one level at a time. Slow (about 8 s for the
4,064 flows of RBD on 16 dgx-h100 nodes) but plain; tests compare the simulator's engine with it.
Kept verbatim apart from the provenance call (the tests do not record a number)."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np


def max_min_rates(flows: list, capacity: dict) -> list[float]:
    """Max-min fair rate of each flow (progressive filling): raise every unfixed flow's rate
    together; when a resource fills (sum of coefficient x rate = capacity), fix its flows."""
    if not flows:
        return []
    keys = {k: i for i, k in enumerate(capacity)}
    f_idx, r_idx, coef = [], [], []
    for i, f in enumerate(flows):
        for k, c in f.uses.items():
            f_idx.append(i)
            r_idx.append(keys[k])
            coef.append(c)
    f_idx, r_idx, coef = np.array(f_idx, int), np.array(r_idx, int), np.array(coef, float)
    remaining = np.array([capacity[k] for k in keys], float)
    rate = np.full(len(flows), math.inf)
    unfixed = np.ones(len(flows), bool)
    while unfixed.any():
        live = unfixed[f_idx]
        load = np.bincount(r_idx[live], weights=coef[live], minlength=len(remaining))
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(load > 0, remaining / load, math.inf)
        level = share.min()
        if not math.isfinite(level):
            break  # flows that use no resource: unlimited
        level = max(level, 0.0)
        full = share <= level * (1 + 1e-12)
        fix_nnz = live & full[r_idx]
        fixed = np.zeros(len(flows), bool)
        fixed[f_idx[fix_nnz]] = True
        fixed &= unfixed
        rate[fixed] = level
        unfixed &= ~fixed
        nnz = fixed[f_idx]
        remaining -= np.bincount(r_idx[nnz], weights=coef[nnz] * level, minlength=len(remaining))
        remaining = np.maximum(remaining, 0.0)
    return rate.tolist()


def run_flows(
    flows: list,
    capacity: dict,
    dependencies: dict[str, list[str]],
    rank_messages: dict,
    per_message_s: float = 0.0,
) -> dict:
    """Event-driven fluid run. ``rank_messages[(rank, phase)]`` = messages that rank issues in
    the phase (per-message overhead). Returns phase start/end times and the total time."""
    phases = list(dict.fromkeys([*dependencies, *(f.phase for f in flows)]))
    by_phase = defaultdict(list)
    for f in flows:
        by_phase[f.phase].append(f)
    start, end = {}, {}
    remaining = {id(f): float(f.nbytes) for f in flows}
    pending = set(phases)
    now = 0.0
    active: list = []
    waiting: list = []

    def release_ready():
        progress = True
        while progress:  # an empty phase ends as it starts and may release its dependents
            progress = False
            for ph in list(pending):
                deps = dependencies.get(ph, [])
                if ph in start or not all(d in end for d in deps):
                    continue
                t0 = max([end[d] for d in deps], default=0.0)
                start[ph] = t0
                for f in by_phase[ph]:
                    f.release = (
                        t0 + per_message_s * rank_messages.get((f.src, ph), 0) + f.release_delay
                    )
                    waiting.append(f)
                if not by_phase[ph]:
                    end[ph] = t0
                    pending.discard(ph)
                    progress = True

    def close_phases():
        changed = False
        for ph in list(pending):
            if ph in start and ph not in end and all(remaining[id(f)] <= 0 for f in by_phase[ph]):
                end[ph] = max([f.finish for f in by_phase[ph]], default=start[ph])
                pending.discard(ph)
                changed = True
        return changed

    release_ready()
    while pending:
        # move released flows to active
        waiting.sort(key=lambda f: f.release)
        while waiting and waiting[0].release <= now + 1e-18:
            active.append(waiting.pop(0))
        if not active:
            if waiting:
                now = waiting[0].release
                continue
            if close_phases():
                release_ready()
                continue
            raise RuntimeError(f"phases {sorted(pending)} can never start (dependency cycle?)")
        rates = max_min_rates(active, capacity)
        horizon = waiting[0].release - now if waiting else math.inf
        dt = min(
            [remaining[id(f)] / r if r > 0 else math.inf for f, r in zip(active, rates)] + [horizon]
        )
        if not math.isfinite(dt):
            raise RuntimeError("a flow has no bandwidth (zero-capacity resource)")
        now += dt
        still = []
        for f, r in zip(active, rates):
            remaining[id(f)] -= r * dt if math.isfinite(r) else remaining[id(f)]
            if remaining[id(f)] <= max(1e-9 * f.nbytes, 1e-12):
                remaining[id(f)] = 0.0
                f.finish = now
            else:
                still.append(f)
        active = still
        if close_phases():
            release_ready()
    return {"time_s": max(end.values(), default=0.0), "phase_start_s": start, "phase_end_s": end}
