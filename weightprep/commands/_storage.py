"""The command-line side of ``weightprep.storage``: ``--storage-options JSON`` and arguments that are a local
directory or a URL."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from weightprep import storage
from weightprep.errors import UsageError

__all__ = ["storage_options", "Location", "LOCATION", "as_location"]

F = TypeVar("F", bound=Callable[..., Any])

STORAGE_OPTIONS_HELP = (
    "JSON object of fsspec options for URLs (s3://, gs://, hf://...), e.g. '{\"endpoint_url\": "
    "\"http://minio:9000\"}'; keys named after a protocol apply to it only: '{\"s3\": {...}, \"hf\": {...}}'. "
    "Credentials otherwise come from the usual places (environment, profiles, AWS_ENDPOINT_URL)."
)


def _configure(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    try:
        storage.configure(value)  # the command's own code then reads URLs with these options
    except UsageError as exc:
        raise click.BadParameter(str(exc).removeprefix("--storage-options: "), ctx, param) from None
    return value


def storage_options(fn: F) -> F:
    """``--storage-options JSON``, applied to this process (and shipped to the build's workers) before the command runs."""
    return click.option(
        "--storage-options", "storage_options", callback=_configure, expose_value=False, is_eager=True,
        help=STORAGE_OPTIONS_HELP,
    )(fn)


class Location(click.ParamType):
    """A local directory (as a Path; ``exists``: it must exist), or a URL (kept as a string: a Path would collapse
    its ``//``)."""

    name = "DIR|URL"

    def __init__(self, *, exists: bool = True) -> None:
        self.exists = exists

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and storage.is_url(value):
            return value.rstrip("/")
        return click.Path(exists=self.exists, file_okay=False, path_type=Path).convert(value, param, ctx)


LOCATION = Location()


def as_location(value: Any) -> Any:
    """A directory setting (from a flag or a config file) as a Path, a URL as a string."""
    return value.rstrip("/") if isinstance(value, str) and storage.is_url(value) else Path(value)
