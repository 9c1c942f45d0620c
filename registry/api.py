"""The Python API: `Registry`. Each public method is one managed transaction and returns plain dataclasses;
the CLI (cli.py) and the HTTP server are thin mirrors of these methods.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import ingest
from .errors import InputError, NotFound
from .store import Store


@dataclass
class ModelInfo:
    name: str
    evaluations: int
    accuracy: float | None
    family: str | None = None
    provider: str | None = None
    params_b: float | None = None
    cost: float | None = None
    open_weights: bool | None = None
    tags: dict = field(default_factory=dict)
    created: str | None = None


@dataclass
class ModelDetail(ModelInfo):
    per_category: dict[str, dict] = field(default_factory=dict)  # category -> {"evaluations", "accuracy"}
    batches: list[int] = field(default_factory=list)


@dataclass
class Stats:
    models: int
    queries: int
    evaluations: int          # current evaluations: the newest per (model, query)
    evaluation_rows: int      # every stored row, superseded ones included
    text_vectors: int
    import_batches: int
    splits: dict[str, int]
    path: str


# The newest evaluation of each (model, query) pair counts; older rows are kept, never overwritten.
CURRENT_EVALUATIONS = """(SELECT model_id, query_id, arg_max(correct, batch_id) AS correct, max(batch_id) AS batch_id
                          FROM evaluations GROUP BY model_id, query_id)"""


def to_dict(obj) -> dict:
    return asdict(obj)


class Registry:
    """A model registry in one DuckDB file. `Registry(path)` opens (and, if new, creates) it."""

    def __init__(self, path: str | Path | None = None, migrate: bool = True):
        self.store = Store(path, migrate=migrate)
        self.path = self.store.path

    def close(self) -> None:
        self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- writing ------------------------------------------------------------------------------------------------
    def import_files(self, models: str | None = None, queries: str | None = None, evaluations: str | None = None,
                     splits: str | None = None, directory: str | None = None,
                     progress: bool = False) -> ingest.ImportResult:
        """Import any of models (CSV), queries (CSV/JSONL/Parquet), evaluations (long format) and splits, or a
        folder laid out like ../shared/data/mmlu-pro. All or nothing: a bad file changes nothing."""
        files = ingest.files_in_dir(directory) if directory else {}
        for kind, path in (("models", models), ("queries", queries), ("evaluations", evaluations),
                           ("splits", splits)):
            if path:
                files[kind] = str(path)
        if not files:
            raise InputError("nothing to import: give a folder or at least one of --models, --queries, "
                             "--evaluations, --splits")
        with self.store.tx() as tx:
            return ingest.run_import(tx, files, progress=progress)

    # --- reading ------------------------------------------------------------------------------------------------
    def models(self) -> list[ModelInfo]:
        with self.store.tx() as tx:
            rows = tx.sql(f"""
                SELECT m.name, count(e.query_id), avg(e.correct::INT), m.family, m.provider, m.params_b, m.cost,
                       m.open_weights, m.tags::VARCHAR, m.created::VARCHAR
                FROM models m LEFT JOIN {CURRENT_EVALUATIONS} e ON e.model_id = m.id
                GROUP BY ALL ORDER BY m.name""")
        return [_model_info(ModelInfo, r) for r in rows]

    def show(self, name: str) -> ModelDetail:
        with self.store.tx() as tx:
            rows = tx.sql(f"""
                SELECT m.name, count(e.query_id), avg(e.correct::INT), m.family, m.provider, m.params_b, m.cost,
                       m.open_weights, m.tags::VARCHAR, m.created::VARCHAR
                FROM models m LEFT JOIN {CURRENT_EVALUATIONS} e ON e.model_id = m.id
                WHERE m.name = ? GROUP BY ALL""", [name])
            if not rows:
                raise NotFound(f"unknown model {name!r}")
            detail = _model_info(ModelDetail, rows[0])
            cats = tx.sql(f"""
                SELECT coalesce(q.category, '(none)'), count(*), avg(e.correct::INT)
                FROM {CURRENT_EVALUATIONS} e JOIN models m ON m.id = e.model_id JOIN queries q ON q.id = e.query_id
                WHERE m.name = ? GROUP BY 1 ORDER BY 1""", [name])
            detail.per_category = {c: {"evaluations": n, "accuracy": round(a, 4)} for c, n, a in cats}
            detail.batches = [r[0] for r in tx.sql("""
                SELECT DISTINCT e.batch_id FROM evaluations e JOIN models m ON m.id = e.model_id
                WHERE m.name = ? ORDER BY 1""", [name])]
        return detail

    def stats(self) -> Stats:
        with self.store.tx() as tx:
            (models, queries, rows, vectors, batches) = tx.sql("""
                SELECT (SELECT count(*) FROM models), (SELECT count(*) FROM queries),
                       (SELECT count(*) FROM evaluations), (SELECT count(*) FROM text_vectors),
                       (SELECT count(*) FROM import_batches)""")[0]
            current = tx.sql(f"SELECT count(*) FROM {CURRENT_EVALUATIONS}")[0][0]
            splits = dict(tx.sql("SELECT split, count(*) FROM query_splits GROUP BY split ORDER BY split"))
        return Stats(models=models, queries=queries, evaluations=current, evaluation_rows=rows,
                     text_vectors=vectors, import_batches=batches, splits=splits, path=self.path)


def _model_info(cls, row):
    name, n, acc, family, provider, params_b, cost, open_weights, tags, created = row
    return cls(name=name, evaluations=int(n), accuracy=None if acc is None else round(float(acc), 4),
               family=family, provider=provider, params_b=params_b, cost=cost, open_weights=open_weights,
               tags=json.loads(tags) if tags else {}, created=created)
