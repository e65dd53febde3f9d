"""Docstrings and comments follow the design notes' "Where prose lives" (shared DESIGN.md).

Docstrings say what a thing does and why, with the paper section; a design explanation longer
than a screen goes to docs/ (a module docstring here is at most MAX_MODULE_DOCSTRING_LINES
lines, counted from the opening to the closing quotes). Measured figures live in records, the
validation set and the site, never in docstrings or comments: no run histories, no "was X, now
Y" (history that explains a design choice goes to docs/measurement-log.md, dated).

The run-history check is a short list of patterns (RUN_HISTORY), each for one way a run's
figures or a change's history were written into prose. It reads docstrings with ``ast``
(module, class and function docstrings) and comments with ``tokenize``; strings the code
prints are not prose and are not read.
"""

import ast
import io
import pathlib
import re
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = (
    "components",
    "suites",
    "reproductions",
    "reports",
    "records",
    "runtime",
    "moe_repro",
    "catalog",
)
MAX_MODULE_DOCSTRING_LINES = 30

# (pattern, what it catches). Case-insensitive; matched against one docstring or one comment
# with its line breaks turned into spaces.
RUN_HISTORY = [
    (r"\b\d+ stored runs\b", "a count of stored runs a figure came from"),
    (r"\b(six|\d+) (MPI|gloo|NCCL) runs\b", "a count of runs a figure came from"),
    (r"\bon a second machine\b", "a figure from another run on another machine"),
    (r"\b(this|loaded) (loaded )?\d+-core machine\b", "the development machine's load or size"),
    (r"\bon this (loaded|busy|shared) machine\b", "the development machine's load"),
    (r"\bwas [^.;:]{1,60}, now\b", "'was X, now Y'"),
    (r"\bbefore this (module|change|commit|fix|patch)\b", "the state before a change"),
    (r"\bthis (suite|module|model|planner) used before\b", "a model a change replaced"),
    (
        r"(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )(?<!\bwas )(?<!\bwere )(?<!\bnever )"
        r"(?<!\bnot )\b(?-i:used to)\b",
        "'used to' in lower case (a sentence opening 'Used to ...' says what a function is for)",
    ),
    (r"\ban? earlier \w+ of ours\b", "an earlier version of the code"),
    (r"\bthe old (engine|model|planner|code|version)\b", "an earlier version of the code"),
    (r"\bbefore/after\b", "a before/after comparison"),
    (r"\btook (about )?\d[\d.\-]* ?(ns|us|ms|s)\b", "a time a run took"),
    (r"\d ?ms with(out)? them\b", "a time a run took, with and without a change"),
    (
        r"\bmeasured (about )?\d[\d.\-]* ?(ns|us|ms|s|x)?\b(?! (rows|ranks|sizes|points|layers))",
        "a figure a run measured",
    ),
    (r"\d ?s of CPU instead of\b", "a speed-up a change gave"),
    (
        r"\bcame (out|to) (at |up to |about )?\d[\d.\-]*(%| ?(ns|us|ms|s|x|times)\b)",
        "a figure a run came out at",
    ),
]
_COMPILED = [(re.compile(p, re.IGNORECASE), why) for p, why in RUN_HISTORY]


def _files():
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _docstrings(tree):
    """(line, text) of the module's, every class's and every function's docstring."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                yield body[0].lineno, body[0].value.value


def _comments(source):
    """(line, text) of every comment, consecutive comment lines joined into one."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            line, text = tok.start[0], tok.string.lstrip("#").strip()
            if out and out[-1][2] == line - 1:
                out[-1] = (out[-1][0], out[-1][1] + " " + text, line)
            else:
                out.append((line, text, line))
    return [(first, text) for first, text, _ in out]


def run_history(path):
    """'path:line: why: match' for each docstring or comment that reads like a run history."""
    source = path.read_text()
    found = []
    for line, text in list(_docstrings(ast.parse(source))) + _comments(source):
        flat = " ".join(text.split())
        for pattern, why in _COMPILED:
            m = pattern.search(flat)
            if m:
                found.append(f"{path.relative_to(ROOT)}:{line}: {why}: {m.group(0)!r}")
    return found


def long_module_docstring(path):
    tree = ast.parse(path.read_text())
    first = tree.body[0] if tree.body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        lines = first.end_lineno - first.lineno + 1
        if lines > MAX_MODULE_DOCSTRING_LINES:
            return f"{path.relative_to(ROOT)}: module docstring of {lines} lines"
    return None


def test_module_docstrings_fit_a_screen():
    long = [msg for path in _files() if (msg := long_module_docstring(path))]
    assert not long, (
        "module docstrings over %d lines (move the design text to docs/):\n"
        % MAX_MODULE_DOCSTRING_LINES
        + "\n".join(long)
    )


def test_no_run_history_in_docstrings_or_comments():
    found = [msg for path in _files() for msg in run_history(path)]
    assert not found, (
        "run figures or history in prose (move them to records or "
        "docs/measurement-log.md):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "sentence",
    [
        "a 16 MiB fit came out 7-31% too fast (16 stored runs)",
        "20-57% too slow at 8 (on a second machine 25-30%)",
        "the price model this suite used before",
        "the dispatch took 0.36-0.63 ms with them, 0.27-0.39 ms without",
        "take about 0.8 s of CPU instead of 8 s against the old engine",
        "where the two planners disagreed before this module",
        "about a quarter of an hour on this loaded 2-core machine",
        "an earlier reading of ours, kept as a diagnostic",
        "the bandwidth was 3 GB/s, now 5 GB/s",
    ],
)
def test_patterns_catch_the_quoted_sentences(sentence):
    assert any(p.search(sentence) for p, _ in _COMPILED), sentence


@pytest.mark.parametrize(
    "sentence",
    [
        "the paper's value is looked up, never used to compute ours",
        "real ranks on this machine, grouped into emulated nodes",
        "one row per stored run, oldest first",
        "Piper Table IV: 50 GB/s average",
    ],
)
def test_patterns_leave_plain_prose_alone(sentence):
    assert not any(p.search(sentence) for p, _ in _COMPILED), sentence
