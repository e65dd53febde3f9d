"""The one registry of balancing methods (the package docstring says how to add one).

Its own module so that each balancer's module can import ``register_balancer`` without
importing the package that imports it (no import cycle).
"""

from __future__ import annotations

from moe_repro.components.balance.base import PLAIN_EP, Balancer

BALANCERS: dict[str, Balancer] = {}


def register_balancer(balancer: Balancer) -> Balancer:
    """Add a balancer to the registry under its name (once)."""
    if balancer.name in BALANCERS:
        raise ValueError(f"balancer {balancer.name!r} is already registered")
    BALANCERS[balancer.name] = balancer
    return balancer


def balancer_names() -> tuple[str, ...]:
    """Registered balancer names, in registration order."""
    return tuple(BALANCERS)


def get_balancer(name: str) -> Balancer:
    if name not in BALANCERS:
        raise ValueError(f"unknown balancer {name!r}; known: {', '.join(BALANCERS)}")
    return BALANCERS[name]


def check_knobs(knobs) -> None:
    """Refuse knob names that no registered balancer declares."""
    known = {k for b in BALANCERS.values() for k in b.knobs}
    unknown = sorted(set(knobs) - known)
    if unknown:
        raise ValueError(
            f"unknown balancer knob(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )


register_balancer(PLAIN_EP)
