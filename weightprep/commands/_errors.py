"""Turn weightprep's own errors into one message on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from weightprep.errors import WeightprepError

__all__ = ["reports_errors"]

F = TypeVar("F", bound=Callable[..., Any])


def reports_errors(fn: F) -> F:
    """Decorator for click commands: WeightprepError -> ``error: ...`` and its exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except WeightprepError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted: nothing was written to the output path", err=True)
            sys.exit(130)

    return wrapper  # type: ignore[return-value]
