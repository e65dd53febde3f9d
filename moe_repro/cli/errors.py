"""Error types the CLI maps to exit codes (2 bad input, 1 failure while running)."""

import click


class BadInput(click.ClickException):
    """Invalid input from the user: unknown id, malformed parameter, impossible config. Exit 2."""

    exit_code = 2


class RunFailure(click.ClickException):
    """Something failed while running (a rank died, a check failed to execute). Exit 1."""

    exit_code = 1


class _CheckedPath(click.Path):
    """A path option checked when it is read, before any work: ``problem`` (from
    records/atomic.py, imported late: it is not needed to start the CLI) names what is wrong
    in a few words, and the option fails with ``message`` around it."""

    problem_name = ""  # the records.atomic function that checks the path
    message = "{value!r}: {problem}"

    def convert(self, value, param, ctx):
        from moe_repro.records import atomic

        problem = getattr(atomic, self.problem_name)(value)
        if problem:
            self.fail(self.message.format(value=str(value), problem=problem), param, ctx)
        return super().convert(value, param, ctx)


class OutputFile(_CheckedPath):
    """A file the command writes (records/atomic.py): checked when the option is read, before
    any work. A missing directory is bad input (a typo in a path should not silently create
    directories), as are a directory, an unwritable place, /proc, or a name too long; a device,
    FIFO or symlink is fine (written through, or its target written)."""

    problem_name = "output_file_problem"
    message = "cannot write {value!r}: {problem}"

    def __init__(self):
        super().__init__(dir_okay=False)


class OutputDir(_CheckedPath):
    """A directory the command writes into, created if missing: checked before any work (it
    must not be a file, and its nearest existing ancestor must take a new file)."""

    problem_name = "output_dir_problem"
    message = "cannot write into {value!r}: {problem}"

    def __init__(self):
        super().__init__(file_okay=False)


class ResultsDir(_CheckedPath):
    """The results store directory (--results, MOE_REPRO_RESULTS): checked when the option is
    read, before any work, for what no command can use, reading or storing: an empty name, a
    file, a symlink to nothing, a symlink loop. Whether runs can be saved there is asked by the
    commands that store (ResultsStore.write_problem), so a read-only store can still be read."""

    problem_name = "directory_problem"
    message = "cannot use {value!r} as the results store: {problem}"

    def __init__(self):
        super().__init__(file_okay=False)
