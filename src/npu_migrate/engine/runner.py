"""Running a per-file function over many files: a process pool, results streamed in input order.

`apply` runs the pipeline (`process`) this way, `analyze` its scanners; both get the same pool and the
same crash isolation.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from npu_migrate.engine import pipeline
from npu_migrate.engine.pipeline import FileResult, Job, Mode, Plan, Status, process

if TYPE_CHECKING:  # the pool (multiprocessing, sockets ...) is imported only by a run that starts one
    from concurrent.futures import ProcessPoolExecutor

    from npu_migrate.engine.cache import Cache

#: Below this many files a pool costs more to start than it saves.
INLINE_LIMIT = 8

Item = TypeVar("Item")
Context = TypeVar("Context")
Result = TypeVar("Result")


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def run(jobs: list[Job], plan: Plan, workers: int | None = None, cache: Cache | None = None) -> Iterator[FileResult]:
    """The pipeline over `jobs`: `process(job, plan)` for each, in the order of `jobs`. With a `cache`, a
    file whose entry is there is answered from it (`cached`), and the workers store what they compute."""
    if cache is None or plan.mode is Mode.OUTPUT:
        return run_each(process, jobs, plan, crashed=_not_migrated, workers=workers)
    return cached(jobs, plan, workers, cache)


def cached(jobs: list[Job], plan: Plan, workers: int | None, cache: Cache) -> Iterator[FileResult]:
    """`run` through the cache. First every file is read and hashed here, in the main process, and looked
    up; only the misses go to the pool (started at the first miss; a tree with none starts no process), and
    the results come out in the order of `jobs` still. Nothing but the keys is held for the whole run: a hit is read again when its
    turn comes (and, should its entry have gone since, computed here), so memory does not grow with the
    number of files. In place, only an entry saying "no change" counts: a write is never taken from the
    cache. `--output` does not come here (its unchanged files are copied, which needs the worker)."""
    from npu_migrate.engine.cache import read_for_key

    keys: list[str | None] = []
    for job in jobs:
        raw = read_for_key(job.path)
        key = cache.key(job, raw) if raw is not None else None
        if key is not None and plan.mode is Mode.DIFF:
            # Any entry will do: read it once, when its turn comes (a torn one is computed then).
            keys.append(key if cache.has(key) else None)
        else:  # in place, only an entry of "no change" saves the worker: read it now to know
            keys.append(key if key is not None and _usable(cache.get(key), plan) else None)
    misses = [job for job, key in zip(jobs, keys) if key is None]
    computed = run_each(process_and_store, misses, (plan, cache), crashed=_not_migrated, workers=workers)
    for job, key in zip(jobs, keys):
        if key is None:
            yield next(computed)
            continue
        result = cache.get(key)
        yield result if _usable(result, plan) else process_and_store(job, (plan, cache))


def _usable(result: FileResult | None, plan: Plan) -> bool:
    if result is None:
        return False
    return plan.mode is Mode.DIFF or (plan.mode is Mode.IN_PLACE and result.status is Status.UNCHANGED)


def process_and_store(job: Job, context: tuple[Plan, Cache]) -> FileResult:
    """`process`, then the result filed under the bytes the worker itself read."""
    from npu_migrate.engine import depends

    plan, cache = context
    seen: list[bytes] = []
    # The files besides its own a rule read for this one (a sibling module's helper): filed with the entry.
    with depends.recording() as read:
        result = process(job, plan, seen)
    if seen:
        cache.put(cache.key(job, seen[0]), result, read)
    return result


def _not_migrated(job: Job) -> FileResult:
    return FileResult(
        job.display,
        Status.FAILED,
        error="the worker process died while migrating this file (a crash in the parser?); file left untouched",
    )


def run_each(
    work: Callable[[Item, Context], Result],
    items: Sequence[Item],
    context: Context,
    *,
    crashed: Callable[[Item], Result],
    workers: int | None = None,
) -> Iterator[Result]:
    """`work(item, context)` for each item, in the order of `items` whatever order the workers finish in.

    `work` must be a module-level function (it is pickled by name); `context` is pickled once per worker
    process, when it starts, not once per item. A worker that dies (a segfault in a native parser, the OOM
    killer) breaks the whole pool. The items of the first unfinished chunk are then retried one by one in a
    process of their own, so the one that kills its process gets `crashed(item)` as its result, and the
    rest of the run goes on in a fresh pool.
    """
    workers = workers or default_jobs()
    if workers <= 1 or len(items) < INLINE_LIMIT:
        with _collector_for_files():
            for item in items:
                yield work(item, context)
        return
    from concurrent.futures.process import BrokenProcessPool

    call = functools.partial(_call, work)
    # Small chunks keep the pool busy when a few files are much slower than the rest.
    chunksize = max(1, min(16, len(items) // (workers * 8)))
    done = 0
    while done < len(items):
        try:
            with _pool(workers, context) as pool:
                for result in pool.map(call, items[done:], chunksize=chunksize):
                    done += 1
                    yield result
        except BrokenProcessPool:
            for item in items[done : done + chunksize]:
                done += 1
                yield _isolated(call, item, context, crashed)


def _isolated(
    call: Callable[[Item], Result], item: Item, context: Context, crashed: Callable[[Item], Result]
) -> Result:
    from concurrent.futures.process import BrokenProcessPool

    try:
        with _pool(1, context) as pool:
            return pool.submit(call, item).result()
    except BrokenProcessPool:
        return crashed(item)


class Progress:
    """A one-line progress bar on stderr, only when stderr is a terminal (so `apply --diff . > npu.patch`
    still shows it, and the patch stays byte-identical). Not rich's live display: that reroutes stdout
    through its console and re-wraps long lines, and a diff line must reach stdout exactly as it is.
    Call `clear()` before printing anything while the bar is up, so no output line shares a row with it."""

    def __init__(self, total: int, label: str, *, enabled: bool = True) -> None:
        self.total, self.label, self.done = total, label, 0
        self.enabled = enabled and sys.stderr.isatty()
        self._shown = False
        self._last = 0.0

    def advance(self) -> None:
        self.done += 1
        if not self.enabled or self.total < 2:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and self.done < self.total:
            return  # redrawing on every file would cost more than the files on a fast run
        self._last = now
        width = max(20, shutil.get_terminal_size((80, 24)).columns - 1)
        counts = f" {self.done}/{self.total}"
        room = max(10, min(40, width - len(self.label) - len(counts) - 3))
        filled = room * self.done // self.total
        line = f"{self.label} [{'#' * filled}{'.' * (room - filled)}]{counts}"
        sys.stderr.write("\r\x1b[K" + line[:width])
        sys.stderr.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self._shown = False


# --- worker side ------------------------------------------------------------------------------------

_CONTEXT: Any = None


def _pool(workers: int, context: Any) -> ProcessPoolExecutor:
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=workers, initializer=_start_worker, initargs=(context,))


def _start_worker(context: Any) -> None:
    global _CONTEXT
    _CONTEXT = context
    gc.set_threshold(*GC_THRESHOLDS)
    pipeline.FREEZE_AFTER_IMPORT = True  # a worker lives for the run: what the engine imports, it keeps


#: The cyclic collector's thresholds while files are processed (#26). A file's `ast` and libcst trees are
#: hundreds of thousands of container objects that live as long as the file does; at Python's default
#: (700, 10, 10) the collector runs every 700 of them and walks the whole heap (the rules, libcst, the
#: file's trees) every hundred such runs: on transformers a tenth of the run's time, and a third of what
#: `ast.parse` costs in the pipeline. Garbage in cycles is still collected, a little later: the oldest
#: generation at every collection of the middle one (a full collection still waits until it has grown by a
#: quarter), because (10_000, 50, 100) let the cycles the fused rules leave pile up to twice the live
#: heap (one process over transformers' models/: 269 MB peak against 135 MB now, 126 MB at the default
#: thresholds; CPU the same within noise).
GC_THRESHOLDS = (10_000, 10, 1)


@contextlib.contextmanager
def _collector_for_files():
    """`GC_THRESHOLDS` while files are processed in this process, then whatever was set before."""
    before, frozen = gc.get_threshold(), pipeline.FREEZE_AFTER_IMPORT
    gc.set_threshold(*GC_THRESHOLDS)
    pipeline.FREEZE_AFTER_IMPORT = True
    try:
        yield
    finally:
        gc.set_threshold(*before)
        pipeline.FREEZE_AFTER_IMPORT = frozen


def _call(work: Callable[[Any, Any], Any], item: Any) -> Any:
    return work(item, _CONTEXT)
