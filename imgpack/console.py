"""How every ``pack-images`` subcommand fails: one stderr line and a known exit code.

Wrap a command's body in ``reporting(debug)``: 0 done, 1 failure with one
``pack-images: error: ...`` line on stderr (``--debug``: the traceback), 2 usage
error (click's), 128+N when stopped by signal N (130 for Ctrl-C). It lives
apart from the CLI so that subcommands defined elsewhere (merge, tune) use it
without importing the CLI back.
"""

from __future__ import annotations

import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

from imgpack.errors import ImgpackError

__all__ = ["PROG", "one_line", "reporting", "debug_option", "quiet_option"]

PROG = "pack-images"


def one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
        if not isinstance(exc, (ImgpackError, ValueError)):
            text = f"{type(exc).__name__}: {text}"
    return " ".join(text.split())


@contextmanager
def reporting(
    debug: bool, *, interrupted: Callable[[], str] = lambda: "interrupted"
) -> Iterator[None]:
    """Turn any failure into the CLI's exit codes and one-line messages; ``interrupted``
    says the line for Ctrl-C once the command has stopped (what it left then).
    Ctrl-C raises KeyboardInterrupt in the block whatever handler was set outside it."""
    main = threading.current_thread() is threading.main_thread()
    outside = signal.signal(signal.SIGINT, signal.default_int_handler) if main else None
    try:
        yield
    except (click.exceptions.Exit, click.ClickException):  # an exit code already chosen
        raise
    except KeyboardInterrupt as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"{PROG}: {interrupted()}", err=True)
        raise click.exceptions.Exit(128 + getattr(exc, "signum", signal.SIGINT)) from None
    except Exception as exc:
        if debug:
            raise
        click.echo(f"{PROG}: error: {one_line(exc)}", err=True)
        raise click.exceptions.Exit(1) from None
    finally:
        if outside is not None:
            signal.signal(signal.SIGINT, outside)


debug_option = click.option("--debug", is_flag=True, help="Show the traceback of a failure.")
quiet_option = click.option("--quiet", "-q", is_flag=True, help="No progress bar, no summary.")
