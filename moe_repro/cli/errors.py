"""Error types the CLI maps to exit codes (2 bad input, 1 failure while running)."""

import click


class BadInput(click.ClickException):
    """Invalid input from the user: unknown id, malformed parameter, impossible config. Exit 2."""

    exit_code = 2


class RunFailure(click.ClickException):
    """Something failed while running (a rank died, a check failed to execute). Exit 1."""

    exit_code = 1


class OutputFile(click.Path):
    """A file the command writes (atomically): its directory must exist. A typo in a path
    should not silently create directories, so a missing one is bad input (exit 2)."""

    def __init__(self):
        super().__init__(dir_okay=False)

    def convert(self, value, param, ctx):
        from pathlib import Path

        value = super().convert(value, param, ctx)
        parent = Path(value).parent
        if not parent.is_dir():
            self.fail(f"directory {str(parent)!r} does not exist (it is not created)", param, ctx)
        return value
