"""Error types the CLI maps to exit codes (2 bad input, 1 failure while running)."""

import click


class BadInput(click.ClickException):
    """Invalid input from the user: unknown id, malformed parameter, impossible config. Exit 2."""

    exit_code = 2


class RunFailure(click.ClickException):
    """Something failed while running (a rank died, a check failed to execute). Exit 1."""

    exit_code = 1


class OutputFile(click.Path):
    """A file the command writes (records/atomic.py): checked when the option is read, before
    any work. A missing directory is bad input (a typo in a path should not silently create
    directories), as are a directory, an unwritable place, /proc, or a name too long; a device,
    FIFO or symlink is fine (written through, or its target written)."""

    def __init__(self):
        super().__init__(dir_okay=False)

    def convert(self, value, param, ctx):
        from moe_repro.records.atomic import output_file_problem

        problem = output_file_problem(value)
        if problem:
            self.fail(f"cannot write {str(value)!r}: {problem}", param, ctx)
        return super().convert(value, param, ctx)


class OutputDir(click.Path):
    """A directory the command writes into, created if missing: checked before any work (it
    must not be a file, and its nearest existing ancestor must take a new file)."""

    def __init__(self):
        super().__init__(file_okay=False)

    def convert(self, value, param, ctx):
        from moe_repro.records.atomic import output_dir_problem

        problem = output_dir_problem(value)
        if problem:
            self.fail(f"cannot write into {str(value)!r}: {problem}", param, ctx)
        return super().convert(value, param, ctx)


class ResultsDir(click.Path):
    """The results store directory (--results, MOE_REPRO_RESULTS): checked when the option is
    read, before any work, for what no command can use, reading or storing: an empty name, a
    file, a symlink to nothing, a symlink loop. Whether runs can be saved there is asked by the
    commands that store (ResultsStore.write_problem), so a read-only store can still be read."""

    def __init__(self):
        super().__init__(file_okay=False)

    def convert(self, value, param, ctx):
        from moe_repro.records.atomic import directory_problem

        problem = directory_problem(value)
        if problem:
            self.fail(f"cannot use {str(value)!r} as the results store: {problem}", param, ctx)
        return super().convert(value, param, ctx)
