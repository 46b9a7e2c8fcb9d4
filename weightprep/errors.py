"""Errors that the CLI turns into one clear message and a non-zero exit, never a traceback.

``InputError`` names the file, line and field of a bad record (and the byte offset in the
decompressed stream for compressed input); ``ConfigError`` collects every problem of a
configuration so they are reported together; ``UsageError`` covers the rest (missing tokenizer,
slow tokenizer, output path taken, ...), ``LeftoverParts`` among them: an interrupted build's finished parts
found by a build not told what to do with them; ``AccountingError`` is an internal error: the build's
counts do not balance, so nothing is published. ``BuildInterrupted`` is not an error but a Ctrl-C (a
``KeyboardInterrupt``) that says which finished parts it kept for ``--resume``. Each message says what was found, what was
expected, and how to fix it.
"""

from __future__ import annotations

__all__ = ["CUT_MISSED", "WeightprepError", "InputError", "ConfigError", "UsageError", "LeftoverParts", "AccountingError",
           "BuildInterrupted", "record_position", "record_unit", "kind_path"]


#: The ``InputError`` reason of a JSON array's part whose guessed range was wrong (``json_array.array_blocks``): not
#: the input's fault, and never the user's to see: the build plans the file exactly and builds again.
CUT_MISSED = "cut_missed"


class WeightprepError(Exception):
    """Base class: an error caused by the user's data, configuration or environment."""

    exit_code = 1


class InputError(WeightprepError):
    """A record of the input is malformed. ``str()`` reads ``file:line: field: problem``.

    For compressed input the byte offset of the line in the decompressed stream follows the
    line number (``raw.jsonl.gz:3001 (decompressed byte 181206): pieces[0].weight: ...``), so
    ``zcat raw.jsonl.gz | tail -c +181207 | head -1`` shows it. ``reason`` is the short code
    that ``--skip-invalid`` counts rejects by (``malformed_json``, ``bad_weight``, ...).
    """

    exit_code = 2

    def __init__(
        self,
        path: str,
        line: int,
        field: str,
        problem: str,
        *,
        reason: str = "invalid",
        offset: int | None = None,
    ) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.problem = problem
        self.reason = reason
        self.offset = offset
        where = record_position(path, line)
        if offset is not None and is_compressed(path):
            where += f" (decompressed byte {offset})"
        super().__init__(f"{where}: {field}: {problem}")


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


class LeftoverParts(UsageError):
    """A build without ``--resume`` or ``--overwrite`` found the finished parts of an interrupted build to its output:
    they are kept, and the build stops before any work, so that an hour of finished parts is never thrown away by a
    plain rerun. ``kept``: their directory (or prefix in a store); ``finished``: how many parts it holds."""

    def __init__(self, out: str, kept: str, finished: int) -> None:
        self.out, self.kept, self.finished = out, kept, finished
        super().__init__(
            f"an interrupted build to {out} left {finished} finished part(s) in {kept}: run the same command with "
            "--resume to reuse them (reused only if the inputs, the configuration and the tokenizer are unchanged), "
            "or with --overwrite to discard them"
        )


class BuildInterrupted(KeyboardInterrupt):
    """A build stopped by Ctrl-C (or SIGINT) once ``finished`` of its ``total`` input parts were done; they are kept
    in ``kept`` (the build's temporary directory, or prefix in a store) for ``--resume``. A ``KeyboardInterrupt``, so
    whatever stops on Ctrl-C stops on it too."""

    def __init__(self, out: str, kept: str, finished: int, total: int) -> None:
        self.out, self.kept, self.finished, self.total = out, kept, finished, total
        super().__init__(f"interrupted: {finished} of {total} part(s) finished, kept in {kept}")


class BackendMismatch(UsageError):
    """fastokens and tokenizers gave different ids for a piece of the input (``file:line: field: problem``)."""

    def __init__(self, path: str, line: int, field: str, problem: str) -> None:
        self.path, self.line, self.field, self.problem = path, line, field, problem
        super().__init__(f"{record_position(path, line)}: {field}: {problem}")


class AccountingError(WeightprepError):
    """Internal error: the build's counts do not add up (a bug, not bad input); nothing is published."""

    exit_code = 3

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__(
            "internal error: the build's accounting does not balance, so nothing was written:\n"
            + "\n".join(f"  - {p}" for p in self.problems)
            + "\nplease report this with the command line and the manifest counts"
        )


def record_position(path: str, line: int) -> str:
    """Where a record is, as every message and the report name it: ``raw.jsonl:17``, ``data.parquet: row 4``,
    ``data.json: record 4`` (an array's index)."""
    unit = record_unit(path)
    return f"{path}:{line}" if unit == "line" else f"{path}: {unit} {line}"


def record_unit(path: str) -> str:
    """What numbers the records of ``path``: ``row`` (Parquet/Arrow, from 0), ``record`` (a JSON array's index,
    from 0) or ``line`` (JSON Lines and text, from 1)."""
    if is_columnar(path):
        return "row"
    if kind_path(path).removesuffix(".gz").removesuffix(".zst").endswith(".json"):
        from weightprep.stages.read import file_kind  # reads the file's first bytes once

        return "record" if file_kind(path) == "json_array" else "line"
    return "line"


def kind_path(path: str) -> str:
    """The part of ``path`` whose suffix says what kind of file it is: a URL without its query and fragment (a
    presigned URL ends ``data.jsonl?X-Amz-Signature=...``), a local path as it is."""
    if "://" in path:
        return path.split("#", 1)[0].split("?", 1)[0]
    return path


def is_columnar(path: str) -> bool:
    """True for Parquet and Arrow inputs, whose records are rows (numbered from 0), not lines."""
    return kind_path(path).endswith((".parquet", ".arrow"))


def is_compressed(path: str) -> bool:
    """True for the compressed inputs weightprep reads (.gz, .zst)."""
    return kind_path(path).endswith((".gz", ".zst"))
