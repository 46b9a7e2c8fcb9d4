"""Errors that the CLI turns into one clear message and a non-zero exit, never a traceback.

``InputError`` names the file, line and field of a bad record; ``ConfigError`` collects every
problem of a configuration so they are reported together; ``UsageError`` covers the rest
(missing tokenizer, slow tokenizer, output path taken, ...). Each message says what was found,
what was expected, and how to fix it.
"""

from __future__ import annotations

__all__ = ["WeightprepError", "InputError", "ConfigError", "UsageError"]


class WeightprepError(Exception):
    """Base class: an error caused by the user's data, configuration or environment."""

    exit_code = 1


class InputError(WeightprepError):
    """A record of the input is malformed. ``str()`` reads ``file:line: field: problem``."""

    exit_code = 2

    def __init__(self, path: str, line: int, field: str, problem: str) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.problem = problem
        super().__init__(f"{path}:{line}: {field}: {problem}")


class ConfigError(WeightprepError):
    """A configuration is invalid; ``problems`` lists every ``key: problem`` found."""

    exit_code = 2

    def __init__(self, problems: list[str], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        head = f"invalid configuration{f' in {source}' if source else ''}:"
        super().__init__("\n".join([head, *(f"  - {p}" for p in self.problems)]))


class UsageError(WeightprepError):
    """Anything else the user can fix: a missing file, a slow tokenizer, an output path in the way."""

    exit_code = 2
