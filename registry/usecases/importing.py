"""`registry import` and what travels with it: the CSV/JSONL/Parquet files (or a folder laid out like MMLU-Pro) in
one transaction and then onboarding (`import_files`); splits drawn for the queries without one (`draw_splits`); query
text vectors out to a Parquet file and back in (`export_vectors`, `import_vectors`). A bad file changes nothing.
Results in other formats (harness runs, Every Eval Ever) are usecases/exchange.py."""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict

from registry.answers import catalog
from registry.core.store import Store
from registry.data import import_models_queries, import_run, input_files, vector_files
from registry.data import splits as split_draws
from registry.embedding import answer_store
from registry.usecases import onboard as onboard_uc

IMPORT_MEMORY = 3 << 30       # bytes DuckDB may hold during an import's transaction (at most its own default)


def import_files(store: Store, directory: str | None, named: dict[str, str | None], *, min_evaluations: int,
                 progress: bool = False, onboard: bool = True) -> import_models_queries.ImportResult:
    """A folder's files and those `named` ({kind: path}: models, queries, evaluations, splits, vectors), checked to
    exist before anything, in one transaction; then, with `onboard`, the models whose evaluations changed embedded.
    Ctrl-C: the transaction rolls back (or, during onboarding, the result says what was committed and what is left)."""
    files = input_files.files_to_import(directory, **named)
    with import_run.interruptible(store) as done:     # Ctrl-C: says what was committed, and what is left
        done.files = files
        left = onboard_uc.finish_pending(store, min_evaluations) if onboard else []   # a crash left jobs behind
        started = time.perf_counter()
        with _announced(progress, f"import: reading {', '.join(sorted(files))} (one transaction)"), \
                store.memory_limited(IMPORT_MEMORY), store.tx() as tx:
            result = import_run.run_import(tx, files, progress=progress)
        done.result = result
        result.seconds["import"] = round(time.perf_counter() - started, 3)
        result.finished_pending = [o.model for o in left]
        if onboard and result.affected_models:
            _say(progress, f"import: committed in {result.seconds['import']:.1f} s; embedding "
                           f"{len(result.affected_models)} model(s) whose evaluations changed")
        if onboard:
            result.onboarding = [asdict(o) for o in onboard_uc.onboard(store, min_evaluations,
                                                                       seconds=result.seconds)]
        if result.affected_models:     # (paid here, not by the first `similar`: a pass over every answer)
            started = time.perf_counter()
            with _announced(progress, "import: indexing every model's answers for `similar`"), store.tx() as tx:
                answer_store.get(tx)
            result.seconds["answer index"] = round(time.perf_counter() - started, 3)
        with store.tx() as tx:     # what the registry holds now (two imports at once: the other's rows too)
            s = catalog.stats(tx, store.path)
        result.holds = {"models": s.models, "queries": s.queries, "evaluations": s.evaluations}
    return result


def _say(progress: bool, line: str) -> None:
    """A step of a long import, on stderr (what it is doing before it does it)."""
    if progress:
        print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _announced(progress: bool, line: str, after_s: float = 1.0) -> Iterator[None]:
    """`line` on stderr if the step inside is still running after `after_s` (a quick step, or a bad file refused at
    once, prints nothing but its result)."""
    timer = threading.Timer(after_s, _say, (progress, line)) if progress else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()


def draw_splits(store: Store, *, val: float, test: float | None, seed: int, by: str,
                test_categories: list[str] | None, min_evaluations: int) -> split_draws.DrawResult:
    """Give every query without a split one (`splits.draw`, or whole categories held out with by="category"); the
    models whose embedding input changed are re-embedded."""
    split_draws.check_draw(by, val=val, test=test, test_categories=test_categories)
    onboard_uc.finish_pending(store, min_evaluations)
    with store.tx() as tx:
        result = (split_draws.draw(tx, val, 0.1 if test is None else test, seed) if by == "random"
                  else split_draws.draw_by_category(tx, list(test_categories or []), val, seed))
    result.onboarding = [asdict(o) for o in onboard_uc.onboard(store, min_evaluations)]
    return result


def export_vectors(store: Store, path: str, source: str | None = None,
                   dtype: str = "float32") -> vector_files.VectorsResult:
    """The query text vectors to a Parquet file other registries import (`vector_files.VectorsResult`)."""
    with store.tx() as tx:
        return vector_files.export(tx, path, source, dtype)


def import_vectors(store: Store, path: str) -> vector_files.VectorsResult:
    """A vector file's vectors, checked whole first: a bad file changes nothing (`vector_files.VectorsResult`)."""
    with store.tx() as tx:
        return vector_files.load(tx, path)
