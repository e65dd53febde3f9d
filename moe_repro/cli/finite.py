"""A number option that refuses NaN and infinity (click's FloatRange lets NaN through: every
comparison with NaN is false, so no bound ever rejects it; ``--timeout nan`` would turn hang
detection off)."""

import math

import click


class FiniteFloatRange(click.FloatRange):
    name = "finite float range"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number
