"""The decode-and-write loop of a pack: outcomes in source order, journalled in batches.

Split from ``pack`` (which prepares, resumes and publishes a pack): this part only turns
the samples still to do into records or skips, whatever source they come from, with a
progress bar, and makes SIGTERM stop it the way Ctrl-C does so that the partial file is
kept for a rerun.
"""

from __future__ import annotations

import signal
import threading
from contextlib import ExitStack, closing

from imgpack.packer import decode
from imgpack.packer.journal import Journal
from imgpack.packer.parallel import ParallelDecoder, decode_sample
from imgpack.packer.prepare import PackPlan
from imgpack.packer.summary import progress_bar
from imgpack.packer.writer import PackWriter

__all__ = ["JOURNAL_EVERY", "run_files"]

JOURNAL_EVERY = 32  # outcomes per journal write: at most this much work is redone after SIGKILL


def run_files(
    plan: PackPlan,
    writer: PackWriter,
    journal: Journal,
    *,
    done: int,
    on_error: str,
    workers: int,
    progress: bool | None,
    start_method: str | None,
) -> tuple[int, str | None]:
    """Decode the plan's samples from ``done`` on, write every outcome in order.

    Returns (samples handled, None), or, with on_error "fail", (samples handled, the line
    that says which sample could not be decoded) at the first bad one: the caller discards
    the run.
    """
    files, targets, settings = plan.files, plan.targets, plan.settings
    workers = min(workers, len(files) - done) or 1
    fetch = plan.source.fetcher()
    with ExitStack() as stack:
        stack.callback(fetch.close)
        if workers == 1:
            stack.enter_context(decode.pillow_quiet())  # once, not per file
            results = (
                (i, name, label, *decode_sample(fetch, name, payload, settings))
                for i, name, label, payload in plan.samples(done)
            )
        else:
            decoder = stack.enter_context(
                ParallelDecoder(
                    plan.samples(done),
                    len(files) - done,
                    fetch,
                    settings,
                    workers=workers,
                    record_bytes=writer.max_record_bytes,
                    start_method=start_method,
                    unit_size=plan.source.unit_size,
                )
            )
            results = iter(decoder)
        results = stack.enter_context(closing(results))
        stack.enter_context(_term_as_interrupt())
        bar = progress_bar(progress, len(files), initial=done, unit="img")  # after the fork
        stack.enter_context(bar)
        n = 0
        for i, name, label, payload, info in results:
            if payload is None:
                if on_error == "fail":
                    return n, f"{name}: {info} (--on-error fail: nothing written)"
                writer.skip(name, info)
                journal.add_skip(i, name, info, plan.stamps[i])
            else:
                digest, geometry, size, as_is = info
                target = None if targets is None else targets[i]
                writer.append(
                    payload,
                    label,
                    name,
                    digest,
                    geometry=geometry,
                    target=target,
                    size=size,
                    as_is=as_is,
                )
                length = len(payload) if writer.codec == "jpeg" else None
                journal.add_record(i, name, digest, geometry, size, plan.stamps[i], length, as_is)
            n += 1
            if journal.pending >= JOURNAL_EVERY:
                writer.flush()
                journal.flush()
            bar.update(1)
        writer.flush()
        journal.flush()
    return n, None


class _term_as_interrupt:
    """While packing, SIGTERM (schedulers, ``kill``) stops the run like Ctrl-C does."""

    def __enter__(self):
        self.old = None
        if threading.current_thread() is threading.main_thread():
            self.old = signal.signal(signal.SIGTERM, _interrupt)
        return self

    def __exit__(self, *exc) -> None:
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)


def _interrupt(signum, frame):
    exc = KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")
    exc.signum = signum
    raise exc
