"""getopt_long as Slurm's commands use it: long options by any unambiguous
prefix, values after ``=`` or as the next word, short letters with the value
attached or next. ``sbatch`` (:mod:`minibatch.cli.slurmopts`) and ``srun``
(:mod:`minibatch.cli.srun`) each have a table."""

from __future__ import annotations

from collections.abc import Mapping

from minibatch.errors import InvalidArgument

VALUE, FLAG, OPTIONAL = "value", "flag", "optional"


class LongOptions:
    """Args:
    table: long name -> (short letter or "", arity: VALUE, FLAG or OPTIONAL).
    aliases: other spellings -> long name.
    """

    def __init__(
        self,
        table: Mapping[str, tuple[str, str]],
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        self.table = dict(table)
        self.aliases = dict(aliases or {})
        self.short = {s: name for name, (s, _) in self.table.items() if s}

    def long_name(self, text: str) -> str:
        """A long option or an unambiguous prefix of one -> its full name.

        Underscores count as dashes (old scripts say ``--mem_bind``)."""
        text = text.replace("_", "-")
        text = self.aliases.get(text, text)
        if text in self.table:
            return text
        matches = [name for name in self.table if name.startswith(text)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise InvalidArgument(
                f"option --{text} is ambiguous ({', '.join(sorted(matches))})"
            )
        raise InvalidArgument(f"unknown option --{text}")

    def getopt(self, tokens: list[str]) -> tuple[list[tuple[str, str]], list[str]]:
        """Tokens -> ((long name, value) pairs, operands from the first one on).

        Flags get ""; an optional value must follow ``=`` (``--exclusive=user``).
        """
        out: list[tuple[str, str]] = []
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            if tok == "--":
                return out, tokens[i + 1 :]
            if tok.startswith("--"):
                text, sep, value = tok[2:].partition("=")
                name = self.long_name(text)
            elif tok.startswith("-") and len(tok) > 1:
                name = self.short.get(tok[1], "")
                if not name:
                    raise InvalidArgument(f"unknown option -{tok[1]}")
                value = tok[2:].removeprefix("=")
                sep = "=" if value else ""
                if self.table[name][1] == FLAG and value:
                    raise InvalidArgument(f"option -{tok[1]} takes no value")
            else:
                return out, tokens[i:]
            arity = self.table[name][1]
            if arity == FLAG and sep:
                raise InvalidArgument(f"option --{name} takes no value")
            if arity == VALUE and not sep:
                i += 1
                if i == len(tokens):
                    raise InvalidArgument(f"option --{name} needs a value")
                value = tokens[i]
            out.append((name, value))
            i += 1
        return out, []
