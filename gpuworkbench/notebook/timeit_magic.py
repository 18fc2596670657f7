"""``%gpu timeit [options] statement`` and ``%%gpu timeit [options]`` + a cell: ``gw.timeit`` on a statement run in
the user's namespace, its table shown (HTML in a notebook, text elsewhere).

As with IPython's ``%timeit``, the statement runs as the body of a function whose globals are the user's namespace:
it reads every name defined there, and the names it assigns stay its own.
"""

from __future__ import annotations

import ast
from typing import Any

from ..errors import GpuError
from ..trace.timeit import timeit
from .output import error, present

USAGE = (
    "%gpu timeit [--warmup N] [--budget S] [--flush-l2] [--graph] [-o NAME] STATEMENT   "
    "(or %%gpu timeit [options] with the statement as the cell): device and host time per call"
)
#: Options that take a value, and the ``timeit`` keyword each sets.
_VALUED = {"--warmup": "warmup", "--budget": "budget_s", "-o": "o"}
_FLAGS = {"--flush-l2": "flush_l2", "--graph": "graph"}


def parse(line: str) -> tuple[dict[str, Any], str]:
    """The options at the start of ``line`` (``timeit`` keywords, and ``o``) and the statement after them; raises
    ValueError saying what is wrong."""
    options: dict[str, Any] = {}
    rest = line.strip()
    while rest.startswith("-"):
        word, _, rest = rest.partition(" ")
        rest = rest.lstrip()
        name, eq, value = word.partition("=")
        if name in _FLAGS and not eq:
            options[_FLAGS[name]] = True
            continue
        if name not in _VALUED:
            raise ValueError(f"unknown option {word}")
        if not eq:
            value, _, rest = rest.partition(" ")
            rest = rest.lstrip()
        if not value:
            raise ValueError(f"{name} takes a value")
        key = _VALUED[name]
        try:
            options[key] = int(value) if key == "warmup" else float(value) if key == "budget_s" else value
        except ValueError:
            raise ValueError(f"{name} takes a number, not {value!r}") from None
        if key == "o" and not value.isidentifier():
            raise ValueError(f"-o takes a Python name, not {value!r}")
    return options, rest


def run(magics: Any, line: str, cell: str | None = None) -> Any:
    """``%gpu timeit`` (``cell`` None: the statement ends ``line``) and ``%%gpu timeit`` (the cell is the statement):
    the result is shown, stored under ``-o NAME`` and returned; a usage error or a GpuError is one line on stderr."""
    __tracebackhide__ = True
    what = "%gpu timeit" if cell is None else "%%gpu timeit"
    try:
        options, statement = parse(line)
    except ValueError as exc:
        error(what, f"{exc}\nusage: {USAGE}")
        return None
    if cell is not None:
        if statement:
            error(what, f"unexpected {statement!r} after the options: the cell is the statement\nusage: {USAGE}")
            return None
        statement = cell
    if not statement.strip():
        error(what, f"give a statement to time\nusage: {USAGE}")
        return None
    name = options.pop("o", None)
    try:
        fn = compile_statement(magics.shell, statement)
    except SyntaxError as exc:
        error(what, f"the statement does not parse: {exc.msg} (line {exc.lineno})")
        return None
    try:
        result = timeit(fn, device=magics.device, **options)
    except GpuError as exc:
        error(what, exc)
        return None
    result.statement = _label(statement)
    if name is not None:
        magics.shell.user_ns[name] = result
    present(result)
    return None


def compile_statement(shell: Any, statement: str) -> Any:
    """A function of no arguments that runs ``statement`` (IPython syntax transformed) with the user's namespace as
    its globals; compiled under a cell's file name, so tracebacks show the statement's lines."""
    source = shell.transform_cell(statement)
    tree = ast.parse(source)
    if not tree.body:
        raise SyntaxError("the statement is empty", ("<timeit>", 1, 0, ""))
    wrapper = ast.parse("def _gpu_timeit_statement():\n    pass\n")
    wrapper.body[0].body = tree.body
    ast.fix_missing_locations(wrapper)
    filename = shell.compile.cache(source, shell.execution_count)
    namespace = shell.user_ns
    scope: dict[str, Any] = {}
    exec(compile(wrapper, filename, "exec"), namespace, scope)
    return scope["_gpu_timeit_statement"]


def _label(statement: str) -> str:
    """The statement as the table's headline names it: its first line, cut at 60 characters."""
    lines = [s for s in statement.strip().splitlines() if s.strip()]
    first = lines[0] if lines else ""
    more = " …" if len(lines) > 1 else ""
    return (first if len(first) <= 60 else first[:59] + "…") + more
