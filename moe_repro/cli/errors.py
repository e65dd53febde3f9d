"""Error types the CLI maps to exit codes (DESIGN.md: 2 bad input, 1 failure while running)."""

import click


class BadInput(click.ClickException):
    """Invalid input from the user: unknown id, malformed parameter, impossible config. Exit 2."""

    exit_code = 2


class RunFailure(click.ClickException):
    """Something failed while running (a rank died, a check failed to execute). Exit 1."""

    exit_code = 1
