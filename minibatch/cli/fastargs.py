"""Running a typer command without importing typer, when its command line is plain.

Importing typer, and the pydantic it converts values with, takes ~80 ms: several
times what ``qstat`` does besides. Each command is declared once, for typer
(``alt: Annotated[bool, typer.Option("-a", help=...)] = False``); :func:`parse`
reads those declarations with a stand-in for typer and parses the command line as
click would, but only the command lines click takes as they are: flags, text
values and operands. Anything else (``--help``, a usage error, a number to convert
or check, an option it does not know) makes :func:`parse` return None, and typer
itself runs the command, so help and error messages stay typer's.

The command modules hold :data:`typer`, which imports typer on first use, in
place of the module: typer resolves their string annotations in their globals.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, cast

#: ``typer.Option``/``typer.Argument`` settings that change nothing about how a
#: given text becomes a value; ``min``/``max`` only matter when a value is given,
#: and those values are left to typer anyway (only text is converted here).
_INERT = frozenset({"help", "metavar", "show_default", "hidden", "rich_help_panel"})
_CHECKED_WHEN_GIVEN = frozenset({"min", "max"})
#: Context settings that do not change parsing (the help names are unknown
#: options to :func:`parse`, so typer answers them).
_SETTINGS = frozenset({"help_option_names"})
#: inspect's CO_VARARGS | CO_VARKEYWORDS, without importing inspect (~7 ms).
_STARRED = 0x04 | 0x08


class _LazyTyper:
    """The typer module, imported when an attribute is first read."""

    def __getattr__(self, name: str) -> Any:
        import typer as module

        return getattr(module, name)


typer: Any = _LazyTyper()


class _Declared(NamedTuple):
    argument: bool
    decls: tuple[str, ...]
    settings: dict[str, Any]


class _Declarations:
    """Stands for typer while the annotations are read."""

    @staticmethod
    def Option(*decls: str, **settings: Any) -> _Declared:
        return _Declared(False, decls, settings)

    @staticmethod
    def Argument(*decls: str, **settings: Any) -> _Declared:
        return _Declared(True, decls, settings)


class _Param(NamedTuple):
    name: str
    #: "flag", "text" (str), "texts" (list[str]), or "other" (left to typer).
    kind: str
    declared: _Declared
    required: bool


class _Unsupported(Exception):
    """The command, or this command line, is for typer to parse."""


def _kind(hint: Any, default: Any, required: bool) -> str:
    options = set(hint.__args__) if isinstance(hint, types.UnionType) else {hint}
    options.discard(type(None))
    if options == {bool}:
        if default is not False:  # typer makes other booleans --x/--no-x
            raise _Unsupported
        return "flag"
    if options == {str}:
        return "text"
    if options == {list[str]}:
        return "texts"
    # Anything else is converted by typer, so it is parsed here only when it is
    # not given and its default needs no conversion.
    if not required and default is not None and {type(default)} != options:
        raise _Unsupported
    return "other"


def _params(function: types.FunctionType) -> list[_Param]:
    code = function.__code__
    if code.co_kwonlyargcount or code.co_flags & _STARRED:
        raise _Unsupported
    names = code.co_varnames[: code.co_argcount]
    defaults = function.__defaults__ or ()
    first_default = len(names) - len(defaults)
    namespace = {**function.__globals__, "typer": _Declarations}
    params = []
    for i, name in enumerate(names):
        text = function.__annotations__.get(name)
        if not isinstance(text, str):
            raise _Unsupported
        hint = eval(text, namespace)
        meta: tuple[Any, ...] = getattr(hint, "__metadata__", ())
        if len(meta) != 1 or not isinstance(meta[0], _Declared):
            raise _Unsupported
        declared = meta[0]
        if set(declared.settings) - _INERT - _CHECKED_WHEN_GIVEN:
            raise _Unsupported
        required = i < first_default
        default = None if required else defaults[i - first_default]
        kind = _kind(hint.__origin__, default, required)
        if not declared.argument and (
            required or not declared.decls or any("/" in d for d in declared.decls)
        ):
            raise _Unsupported
        params.append(_Param(name, kind, declared, required))
    return params


def _options(params: list[_Param]) -> dict[str, _Param]:
    """Each option name (``-a``, ``--json``) -> its parameter."""
    by_name = {}
    for param in params:
        for decl in param.declared.decls if not param.declared.argument else ():
            short = len(decl) == 2 and decl[0] == "-" and decl[1] != "-"
            if not (short or decl.startswith("--")):
                raise _Unsupported  # click's single-dash long options
            by_name[decl] = param
    return by_name


def _split(
    argv: list[str], options: dict[str, _Param]
) -> tuple[list[tuple[_Param, str]], list[str]]:
    """click's parsing: (option, value) pairs in order, and the operands."""
    given: list[tuple[_Param, str]] = []
    operands: list[str] = []
    tokens = iter(argv)
    for token in tokens:
        if token == "--":
            operands.extend(tokens)
            break
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            param = options.get(name)
            if param is None or (param.kind == "flag" and eq):
                raise _Unsupported
            if param.kind != "flag" and not eq:
                value = _next(tokens)
            given.append((param, value))
        elif token.startswith("-") and token != "-":
            for i, letter in enumerate(token[1:], start=2):
                param = options.get("-" + letter)
                if param is None:
                    raise _Unsupported
                if param.kind == "flag":
                    given.append((param, ""))
                    continue
                given.append((param, token[i:] or _next(tokens)))
                break
        else:
            operands.append(token)
    return given, operands


def _next(tokens: Iterator[str]) -> str:
    value = next(tokens, None)
    if value is None:
        raise _Unsupported  # "Option requires an argument"
    return value


def _assign(arguments: list[_Param], operands: list[str]) -> dict[str, Any]:
    """Operands -> arguments: single ones first, a list argument (last) the rest."""
    values: dict[str, Any] = {}
    many = arguments[-1] if arguments and arguments[-1].kind == "texts" else None
    singles = arguments[:-1] if many else arguments
    if any(p.kind != "text" for p in singles):
        raise _Unsupported
    if len(operands) > len(singles) and many is None:
        raise _Unsupported  # "Got unexpected extra argument"
    for param, operand in zip(singles, operands, strict=False):
        values[param.name] = operand
    rest = operands[len(singles) :]
    if many is not None and rest:
        values[many.name] = rest
    missing = [p for p in arguments if p.required and p.name not in values]
    if missing:
        raise _Unsupported  # "Missing argument"
    return values


def parse(
    function: Callable[..., Any],
    argv: list[str],
    context_settings: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The keyword arguments typer would call ``function`` with for ``argv``, or
    None when typer has to parse it (see the module's docstring)."""
    if set(context_settings or {}) - _SETTINGS:
        return None
    try:
        params = _params(cast(types.FunctionType, function))
        given, operands = _split(argv, _options(params))
        values = _assign([p for p in params if p.declared.argument], operands)
    # _Unsupported, or an annotation only typer can read (typer.Context, ...).
    except Exception:
        return None
    for param, value in given:
        if param.kind == "flag":
            values[param.name] = True
        elif param.kind == "text":
            values[param.name] = value
        elif param.kind == "texts":
            values.setdefault(param.name, []).append(value)
        else:
            return None
    return values
