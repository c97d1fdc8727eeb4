"""Running the per-file pipeline over many files: a process pool, results streamed in input order."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from npu_migrate.pipeline import FileResult, Job, Plan, Status, process

#: Below this many files a pool costs more to start than it saves.
INLINE_LIMIT = 8


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def run(jobs: list[Job], plan: Plan, workers: int | None = None) -> Iterator[FileResult]:
    """Results in the order of `jobs`, whatever order the workers finish in.

    A worker that dies (a segfault in a native parser, the OOM killer) breaks the whole pool. The files
    of the first unfinished chunk are then retried one by one in a process of their own, so the one that
    kills its process is reported as failed, and the rest of the run goes on in a fresh pool.
    """
    workers = workers or default_jobs()
    work = functools.partial(process, plan=plan)
    if workers <= 1 or len(jobs) < INLINE_LIMIT:
        yield from map(work, jobs)
        return
    # Small chunks keep the pool busy when a few files are much slower than the rest.
    chunksize = max(1, min(16, len(jobs) // (workers * 8)))
    done = 0
    while done < len(jobs):
        try:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                for result in pool.map(work, jobs[done:], chunksize=chunksize):
                    done += 1
                    yield result
        except BrokenProcessPool:
            for job in jobs[done : done + chunksize]:
                done += 1
                yield _isolated(job, plan)


def _isolated(job: Job, plan: Plan) -> FileResult:
    try:
        with ProcessPoolExecutor(max_workers=1) as pool:
            return pool.submit(process, job, plan).result()
    except BrokenProcessPool:
        return FileResult(
            job.display,
            Status.FAILED,
            error="the worker process died while migrating this file (a crash in the parser?); file left untouched",
        )


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
