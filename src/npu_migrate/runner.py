"""Running the per-file pipeline over many files: a process pool, results streamed in input order."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor

from npu_migrate.pipeline import FileResult, Job, Plan, process

#: Below this many files a pool costs more to start than it saves.
INLINE_LIMIT = 8


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def run(jobs: list[Job], plan: Plan, workers: int | None = None) -> Iterator[FileResult]:
    """Results in the order of `jobs`, whatever order the workers finish in."""
    workers = workers or default_jobs()
    work = functools.partial(process, plan=plan)
    if workers <= 1 or len(jobs) < INLINE_LIMIT:
        yield from map(work, jobs)
        return
    # Small chunks keep the pool busy when a few files are much slower than the rest.
    chunksize = max(1, min(16, len(jobs) // (workers * 8)))
    with ProcessPoolExecutor(max_workers=workers) as pool:
        yield from pool.map(work, jobs, chunksize=chunksize)


def with_progress(results: Iterable[FileResult], total: int, enabled: bool) -> Iterator[FileResult]:
    """A progress bar on stderr when it is a terminal; the results pass through unchanged."""
    if not enabled or not sys.stderr.isatty() or total < 2:
        yield from results
        return
    try:
        from rich.progress import Progress
    except ImportError:  # rich comes with typer, but the bar is a nicety, never a requirement
        yield from results
        return
    with Progress(transient=True, console=None) as progress:
        task = progress.add_task("migrating", total=total)
        for result in results:
            progress.advance(task)
            yield result
