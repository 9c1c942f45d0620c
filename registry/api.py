"""The Python API: `Registry`. Each public method is one managed transaction and returns plain dataclasses;
the CLI (cli.py) and the HTTP server are thin mirrors of these methods.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import encoders, evidence, index, ingest, onboarding, querycache, splits
from .errors import InputError, NotFound, RegistryError, unknown_model
from .routing_api import RoutingMixin
from .store import Store, Tx


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
    available: bool = True              # False once marked unavailable (routing and fallback skip it)
    status: str = "not embedded"        # established | probation (too few evaluations to be routed to) | not embedded
    version: int | None = None          # current embedding version under the active encoder
    embedded_from: int | None = None    # evaluations behind that version (test answers are never used)


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
    unsplit_queries: int = 0  # queries without a train/val/test split (`registry draw-splits` gives them one)


# The newest evaluation of each (model, query) pair counts; older rows are kept, never overwritten.
CURRENT_EVALUATIONS = """(SELECT model_id, query_id, arg_max(correct, batch_id) AS correct, max(batch_id) AS batch_id
                          FROM evaluations GROUP BY model_id, query_id)"""


def to_dict(obj) -> dict:
    return asdict(obj)


@dataclass
class Neighbour:
    model: str
    distance: float
    disagreement: float | None = None   # share of shared evaluated queries where the two differ
    shared_queries: int | None = None


@dataclass
class RegisterResult:
    model: str
    version: int | None
    outcome: str                        # embedded | unchanged | too few evaluations
    n_evaluations: int                  # used for the embedding: current evaluations outside the test split
    stability: float | None
    neighbours: list[Neighbour]
    warning: str | None
    evaluations_added: int
    queries_added: int
    held_out: int = 0                   # current evaluations on test queries: kept, never embedded
    status: str = "not embedded"        # established | probation | not embedded (evidence.py)
    updated: dict = field(default_factory=dict)   # metadata field -> [old, new] (with update=True)
    results_changed: int = 0            # results that superseded different stored ones (with update=True)


@dataclass
class VersionInfo:
    version: int
    encoder: str
    encoder_id: int
    n_evaluations: int
    created: str
    reason: str
    batch_id: int | None
    stability: float | None
    digest: str
    distance_moved: float | None        # from the previous version under the same encoder


@dataclass
class History:
    model: str
    versions: list[VersionInfo]


@dataclass
class Diff:
    model: str
    v1: int
    v2: int
    distance: float
    neighbours_v1: list[Neighbour]
    neighbours_v2: list[Neighbour]
    predicted_accuracy: dict[str, dict]  # category -> {"v1", "v2", "change"}


class Registry(RoutingMixin):
    """A model registry in one DuckDB file. `Registry(path)` opens (and, if new, creates) it; with `create=False`
    a missing file is an error (NotFound) instead."""

    def __init__(self, path: str | Path | None = None, migrate: bool = True,
                 min_evaluations: int = onboarding.MIN_EVALUATIONS, create: bool = True,
                 probation_min: int | None = None):
        self.store = Store(path, migrate=migrate, create=create)
        self.path = self.store.path
        self.min_evaluations = min_evaluations
        self.probation_min = evidence.probation_min(probation_min)   # fewer evaluations: on probation

    def close(self) -> None:
        index.flush(self.store.cache, self.path)
        self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- writing ------------------------------------------------------------------------------------------------
    def import_files(self, models: str | None = None, queries: str | None = None, evaluations: str | None = None,
                     splits: str | None = None, directory: str | None = None,
                     progress: bool = False, onboard: bool = True, vectors: str | None = None) -> ingest.ImportResult:
        """Import any of models (CSV), queries (CSV/JSONL/Parquet), evaluations (long format), splits and query
        text vectors (vectors.py), or a folder laid out like ../shared/data/mmlu-pro (its `text_vectors.parquet`
        too). All or nothing: a bad file changes nothing."""
        files = ingest.files_in_dir(directory) if directory else {}
        for kind, path in (("models", models), ("queries", queries), ("evaluations", evaluations),
                           ("splits", splits), ("vectors", vectors)):
            if path:
                files[kind] = str(path)
        if not files:
            raise InputError("nothing to import: give a folder or at least one of --models, --queries, "
                             "--evaluations, --splits")
        if onboard:  # a crash may have left jobs behind: any writing command finishes them
            self._finish_pending()
        with self.store.tx() as tx:
            result = ingest.run_import(tx, files, progress=progress)
        if onboard:
            result.onboarding = [asdict(o) for o in self.onboard()]
        return result

    def export_vectors(self, path: str, source: str | None = None, dtype: str = "float32"):
        """Write the registry's query text vectors to a Parquet file that other registries import
        (`vectors.VectorsResult`)."""
        from . import vectors

        with self.store.tx() as tx:
            return vectors.export(tx, path, source, dtype)

    def import_vectors(self, path: str):
        """Add the query text vectors of a file made by `export_vectors`, checked whole first: a bad file changes
        nothing (`vectors.VectorsResult`)."""
        from . import vectors

        with self.store.tx() as tx:
            return vectors.load(tx, path)

    def draw_splits(self, val: float = 0.1, test: float = 0.1, seed: int = 0) -> splits.DrawResult:
        """Give every query without a split one, drawn with `seed` within each category (shares `val` and `test`,
        the rest train); a query's split, once set, is kept. Models whose test queries change are re-embedded."""
        splits.check_shares(val, test)
        self._finish_pending()
        with self.store.tx() as tx:
            result = splits.draw(tx, val, test, seed)
        result.onboarding = [asdict(o) for o in self.onboard()]
        return result

    # --- reading ------------------------------------------------------------------------------------------------
    def models(self) -> list[ModelInfo]:
        """Every model: evaluations, accuracy, metadata, availability, current version and evidence status."""
        with self.store.tx() as tx:
            rows = tx.sql(f"""
                SELECT m.name, count(e.query_id), avg(e.correct::INT), m.family, m.provider, m.params_b, m.cost,
                       m.open_weights, m.tags::VARCHAR, m.created::VARCHAR
                FROM models m LEFT JOIN {CURRENT_EVALUATIONS} e ON e.model_id = m.id
                GROUP BY ALL ORDER BY m.name""")
            return [self._with_state(tx, _model_info(ModelInfo, r)) for r in rows]

    def _with_state(self, tx: Tx, info):
        """Fill in availability, the current version and its evidence status (evidence.py)."""
        from . import routing

        if "_states" not in tx.local:
            encoder_id = encoders.active_id(tx)
            current = {} if encoder_id is None else {r[0]: r[1:] for r in tx.sql("""
                SELECT m.name, arg_max(v.version, v.version), arg_max(v.n_evaluations, v.version)
                FROM embedding_versions v JOIN models m ON m.id = v.model_id WHERE v.encoder_id = ?
                GROUP BY m.name""", [encoder_id])}
            tx.local["_states"] = (current, set(routing.unavailable_models(tx)))
        current, down = tx.local["_states"]
        info.available = info.name not in down
        if info.name in current:
            info.version, info.embedded_from = current[info.name]
            info.status = "probation" if info.embedded_from < self.probation_min else "established"
        return info

    def show(self, name: str) -> ModelDetail:
        with self.store.tx() as tx:
            rows = tx.sql(f"""
                SELECT m.name, count(e.query_id), avg(e.correct::INT), m.family, m.provider, m.params_b, m.cost,
                       m.open_weights, m.tags::VARCHAR, m.created::VARCHAR
                FROM models m LEFT JOIN {CURRENT_EVALUATIONS} e ON e.model_id = m.id
                WHERE m.name = ? GROUP BY ALL""", [name])
            if not rows:
                raise unknown_model(name, _model_names(tx))
            detail = self._with_state(tx, _model_info(ModelDetail, rows[0]))
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
                     text_vectors=vectors, import_batches=batches, splits=splits, path=self.path,
                     unsplit_queries=queries - sum(splits.values()))


    # --- onboarding, embedding versions, neighbours ----------------------------------------------------------
    def onboard(self, all_models: bool = False, stability: bool = True) -> list[onboarding.JobOutcome]:
        """Run every pending onboarding job (`all_models`: re-embed every model) and write the new versions (indexed
        as they commit); then, unless `stability` is False, estimate the stability of every version still without
        one (`estimate_stability`)."""
        with self.store.tx() as tx:
            outcomes = onboarding.run_pending(tx, self.min_evaluations, all_models=all_models)
        if stability:
            estimates = self.estimate_stability()
            for o in outcomes:
                o.stability = estimates.get(o.version_id, o.stability)
        return outcomes

    def estimate_stability(self) -> dict[int, float]:
        """Stability estimates for the versions without one (normally those the last onboarding wrote): the
        distance between the embeddings of two random halves of a version's evaluations. -> {version id: value}"""
        with self.store.tx() as tx:
            return onboarding.estimate_stability(tx)

    def _finish_pending(self) -> None:
        with self.store.tx() as tx:
            has = bool(onboarding.pending(tx))
        if has:
            self.onboard()

    def register(self, name: str, evals: str, family: str | None = None, provider: str | None = None,
                 params_b: float | None = None, cost: float | None = None, open_weights: bool | None = None,
                 tags: dict | None = None, k: int = 5, progress: bool = False, update: bool = False
                 ) -> RegisterResult:
        """Register a model with its 0/1 results and embed it with the active encoder, in one call. Adding results
        to a registered model is fine; changing its metadata, or results it already has, needs `update=True` (the
        old results are kept as older evaluations), and the result says what changed."""
        name = (name or "").strip()
        if not name:
            raise InputError("empty model name")
        for label, value in (("params_b", params_b), ("cost", cost)):
            if value is not None and not (value >= 0 and value != float("inf")):
                raise InputError(f"{label} must be a non-negative number, got {value}")
        self._finish_pending()
        with self.store.tx() as tx:
            changes = _upsert_model_metadata(tx, name, family=family, provider=provider, params_b=params_b,
                                             cost=cost, open_weights=open_weights, tags=tags)
            if changes and not update:
                field_, (old, new) = next(iter(changes.items()))
                raise InputError(f"{name!r} is already registered with {field_}={old!r} (given {new!r}"
                                 + (f", and {len(changes) - 1} more field(s)" if len(changes) > 1 else "")
                                 + "): pass --update (update=True) to change its metadata")
            imported = ingest.run_model_import(tx, name, str(evals), progress=progress)
            changed = _changed_results(tx, name, imported.batch_id)
            if changed and not update:
                qid, old, new = changed[1]
                raise InputError(f"{changed[0]} of these results differ from the ones {name!r} already has (e.g. "
                                 f"query {qid}: stored {old}, given {new}): pass --update (update=True) to record them "
                                 f"as newer evaluations (the old ones are kept)", file=str(evals))
        outcomes = {o.model: o for o in self.onboard()}
        with self.store.tx() as tx:
            o = outcomes.get(name)
            if o is None:  # nothing new to embed: report the model's current version
                latest = tx.sql("""SELECT v.version, v.n_evaluations FROM embedding_versions v
                                   JOIN models m ON m.id = v.model_id WHERE m.name = ? AND v.encoder_id = ?
                                   ORDER BY v.version DESC LIMIT 1""", [name, encoders.active_id(tx)])
                o = onboarding.JobOutcome(name, "unchanged", latest[0][0] if latest else None,
                                          int(latest[0][1]) if latest else 0)
            held_out = tx.sql(f"""SELECT count(*) FROM {CURRENT_EVALUATIONS} e JOIN models m ON m.id = e.model_id
                                  JOIN query_splits s ON s.query_id = e.query_id
                                  WHERE m.name = ? AND s.split = 'test'""", [name])[0][0]
            neighbours, warning = [], None
            status = "not embedded"
            if o.version is not None:
                neighbours = self._neighbours_of(tx, name, k)
                status = "probation" if o.n_evaluations < self.probation_min else "established"
                warning = (_duplicate_warning(tx, name, neighbours) if status == "established" else
                           f"on probation: embedded from {o.n_evaluations} evaluations, routing needs "
                           f"{self.probation_min} to choose it unasked; its neighbours and any same-model claim are "
                           f"unreliable at this size")
        return RegisterResult(model=name, version=o.version, outcome=o.outcome, n_evaluations=o.n_evaluations,
                              stability=o.stability, neighbours=neighbours, warning=warning,
                              evaluations_added=imported.evaluations_added, queries_added=imported.queries_added,
                              held_out=int(held_out), status=status, updated=changes,
                              results_changed=changed[0] if changed else 0)

    def _neighbours_of(self, tx: Tx, name: str, k: int, as_of: str | None = None,
                       exclude: set[str] | None = None) -> list[Neighbour]:
        encoder_id = _active_encoder(tx, as_of)
        vi = index.get(tx, self.path, encoder_id, as_of)
        vector = vi.vector_of(name)                                  # no SQL when indexed
        if vector is None:
            vector, _ = _vector_of(tx, name, encoder_id, as_of)
        return self._similar_by_vector(tx, vector, k, encoder_id, as_of, exclude=(exclude or set()) | {name},
                                       compare_with=name, vi=vi)

    def _similar_by_vector(self, tx: Tx, vector, k: int, encoder_id: int, as_of: str | None = None,
                           exclude: set[str] | None = None, compare_with: str | None = None,
                           vi: index.VectorIndex | None = None) -> list[Neighbour]:
        """The core of every similarity question: the k nearest current embeddings to one vector."""
        vi = vi or index.get(tx, self.path, encoder_id, as_of)
        if vi.size == 0:
            raise InputError("the registry has no embedded models yet: import evaluations first (`registry import`)")
        exclude = exclude or set()
        if k <= 0:
            raise InputError(f"k must be at least 1, got {k}")
        dist, ids = vi.search(vector[None, :], min(vi.size, k + len(exclude)))
        found = [(int(i), float(d)) for d, i in zip(dist[0], ids[0]) if i >= 0 and vi.names[int(i)] not in exclude][:k]
        out = [Neighbour(vi.names[i], round(d, 4)) for i, d in found]
        own_id = vi.id_of(compare_with) if compare_with else None
        if own_id is not None and out:
            rates = _disagreement(tx, own_id, [i for i, _ in found])
            for (i, _), n in zip(found, out):
                if i in rates:
                    n.shared_queries, n.disagreement = rates[i][0], round(rates[i][1], 4)
        return out

    def history(self, name: str) -> History:
        with self.store.tx() as tx:
            if not tx.sql("SELECT 1 FROM models WHERE name = ?", [name]):
                raise unknown_model(name, _model_names(tx))
            rows = tx.sql("""
                SELECT v.version, e.name, v.encoder_id, v.n_evaluations, v.created::VARCHAR, v.reason, v.batch_id,
                       coalesce(s.stability, v.stability), v.digest, v.vector
                FROM embedding_versions v JOIN models m ON m.id = v.model_id JOIN encoders e ON e.id = v.encoder_id
                LEFT JOIN version_stability s ON s.version_id = v.id
                WHERE m.name = ? ORDER BY v.version""", [name])
        import numpy as np

        versions, last = [], {}
        for version, enc, enc_id, n, created, reason, batch, stab, digest, vec in rows:
            vec = np.asarray(vec, dtype=np.float32)
            moved = None if enc_id not in last else round(float(np.linalg.norm(vec - last[enc_id])), 4)
            last[enc_id] = vec
            versions.append(VersionInfo(version, enc, enc_id, n, created, reason, batch,
                                        None if stab is None else round(stab, 4), digest, moved))
        return History(name, versions)

    def diff(self, name: str, v1: int | None = None, v2: int | None = None, k: int = 5) -> Diff:
        """How far a model moved between two versions (default: the two newest), how its nearest neighbours changed
        (as the registry stood at each version), and how its predicted accuracy per category changed."""
        import numpy as np

        with self.store.tx() as tx:
            rows = {r[0]: r[1:] for r in tx.sql("""
                SELECT v.version, v.encoder_id, v.vector, v.created::VARCHAR FROM embedding_versions v
                JOIN models m ON m.id = v.model_id WHERE m.name = ? ORDER BY v.version""", [name])}
            if not rows:
                self.show(name)  # raises NotFound for an unknown model
                raise NotFound(f"model {name!r} has no embedding versions")
            newest = sorted(rows)
            if len(newest) == 1 and v1 is None and v2 is None:
                raise InputError(f"{name!r} has one embedding version (v{newest[0]}): nothing to compare yet "
                                 f"(a new version comes with new evaluations or another encoder)")
            v2 = v2 if v2 is not None else newest[-1]
            v1 = v1 if v1 is not None else (newest[-2] if len(newest) > 1 else newest[-1])
            for v in (v1, v2):
                if v not in rows:
                    raise NotFound(f"model {name!r} has no version {v} (versions: {newest})")
            (e1, z1, t1), (e2, z2, t2) = rows[v1], rows[v2]
            z1, z2 = np.asarray(z1, np.float32), np.asarray(z2, np.float32)
            distance = float(np.linalg.norm(z1 - z2)) if e1 == e2 else float("nan")
            n1 = self._similar_by_vector(tx, z1, k, e1, as_of=t1, exclude={name}, compare_with=name)
            n2 = self._similar_by_vector(tx, z2, k, e2, as_of=t2, exclude={name}, compare_with=name)
            acc = {}
            for version, enc, z in ((v1, e1, z1), (v2, e2, z2)):
                for cat, p in _predicted_category_accuracy(tx, enc, z).items():
                    acc.setdefault(cat, {})["v1" if version == v1 else "v2"] = round(p, 4)
            for cat, d in acc.items():
                d.setdefault("v2", d.get("v1"))
                d["change"] = round(d["v2"] - d["v1"], 4)
        return Diff(name, v1, v2, round(distance, 4), n1, n2, acc)

    def encoders(self) -> list[encoders.EncoderInfo]:
        with self.store.tx() as tx:
            encoders.ensure_default(tx)
            return encoders.listing(tx)

    def activate_encoder(self, encoder_id: int) -> list[onboarding.JobOutcome]:
        """Make an encoder active; every model is re-embedded under it (old versions stay)."""
        with self.store.tx() as tx:
            encoders.activate(tx, int(encoder_id))
        return self.onboard()

    def install_encoder(self, path: str, name: str | None = None, activate: bool = False) -> int:
        p = Path(path)
        if not p.is_file():
            raise InputError("no such file", file=str(path))
        with self.store.tx() as tx:
            encoder_id = encoders.install(tx, p.read_bytes(), name=name, source=str(path))
        if activate:
            self.activate_encoder(encoder_id)
        return encoder_id

    def recompute_version(self, name: str, version: int):
        """(stored vector, recomputed vector, digest matches) for one version: versions are reproducible."""
        with self.store.tx() as tx:
            row = tx.sql("""SELECT v.id FROM embedding_versions v JOIN models m ON m.id = v.model_id
                            WHERE m.name = ? AND v.version = ?""", [name, version])
            if not row:
                raise NotFound(f"model {name!r} has no version {version}")
            return onboarding.recompute(tx, row[0][0])

    def similar(self, model: str | None = None, k: int = 5, evals: str | None = None,
                 as_of: str | None = None) -> list[Neighbour]:
        """Nearest registered models to a registered model, or to results of an unregistered one (`evals`, embedded
        on the fly, nothing written), with how often each disagrees with it on the queries both answered. A k
        larger than the pool returns the whole pool."""
        if (model is None) == (evals is None):
            raise InputError("give a model name or an evaluations file (not both)")
        with self.store.tx() as tx:
            if model is not None:
                return self._neighbours_of(tx, model, k, as_of)
            encoder_id = _active_encoder(tx, as_of)
            vector, qids, y = self._embed_file(tx, evals, encoder_id)
            out = self._similar_by_vector(tx, vector, k, encoder_id, as_of)
            vi = index.get(tx, self.path, encoder_id, as_of)
            rates = _disagreement_rows(tx, qids, y, [vi.id_of(n.model) for n in out])
            for n in out:
                shared = rates.get(vi.id_of(n.model))
                if shared:
                    n.shared_queries, n.disagreement = shared[0], round(shared[1], 4)
            return out

    # --- the encoder: training and evaluation ------------------------------------------------------------------
    def evaluate(self, split: str = "test", baselines: bool = True, sample_efficiency: bool = False,
                 seeds: int = 5):
        """Routing accuracy and predictor quality of LOCUS on a split, beside the baselines, in one run, over the
        models with an up-to-date embedding (pending onboarding is finished first; the others are reported)."""
        from . import evaluation

        self._finish_pending()
        with self.store.tx() as tx:
            return evaluation.evaluate(tx, split, baselines=baselines, sample_efficiency=sample_efficiency,
                                       seeds=seeds, probation_min=self.probation_min)

    def train(self, seed: int = 0, anchors: int | None = None, max_steps: int | None = None,
              epochs: int | None = None, activate: bool = False, name: str | None = None, progress=None) -> int:
        """Train a LOCUS encoder on the registry's own train split (validation split for model selection) and store
        it as a checkpoint; returns its encoder id. `activate` makes it active (every model is re-embedded)."""
        from dataclasses import asdict, replace

        from . import evaluation, textvec, training
        from .checkpoint import save_checkpoint

        for flag, value in (("--anchors", anchors), ("--steps", max_steps), ("--epochs", epochs)):
            if value is not None and value < 1:
                raise InputError(f"{flag} must be at least 1, got {value}")
        cfg = training.TrainConfig(seed=seed)
        if anchors is not None:
            cfg = replace(cfg, anchors=anchors, min_anchors=min(cfg.min_anchors, anchors))
        if max_steps is not None:
            cfg = replace(cfg, max_steps=max_steps)
        if epochs is not None:
            cfg = replace(cfg, teacher_epochs=epochs)
        with self.store.tx() as tx:
            data = evaluation.dataset(tx)
        for split in ("train", "val"):
            if len(data.splits[split]) == 0:
                raise RegistryError(f"no queries in the {split} split: training fits on train and selects on val")
        # a model with no train evaluations has nothing to learn from (say, listed in models.csv only)
        left_out = ~(data.correct[:, data.splits["train"]] >= 0).any(axis=1)
        data = evaluation.without(data, left_out)
        if len(data.models) < 2:
            raise RegistryError(f"{len(data.models)} model(s) with train evaluations: training needs at least 2")
        model, config, metrics = training.train(data.qvecs, data.correct, data.splits["train"], data.splits["val"],
                                                cfg, progress=progress)
        digest = data.digest()
        meta = {"name": name or f"locus-seed{seed}-{digest[:8]}", "text_encoder": textvec.TEXT_ENCODER,
                "metrics": metrics, "train_data_digest": digest, "embed_max_set": None,
                "train_config": json.loads(json.dumps(asdict(cfg), default=str))}
        blob = save_checkpoint(model, config, meta)
        with self.store.tx() as tx:
            encoder_id = encoders.install(tx, blob, name=meta["name"])
        if activate:
            self.activate_encoder(encoder_id)
        return encoder_id

    # --- the embedding space: fingerprint, portfolio, fallback, map, geometry (issue 5) -------------------------
    def _pool(self, tx: Tx, as_of: str | None = None):
        from . import geometry

        return geometry.pool(tx, self.path, _active_encoder(tx, as_of), as_of)

    def fingerprint(self, evals: str, as_of: str | None = None):
        """Is the endpoint behind these results one of the registered models? Nearest model, distance and a verdict
        from the threshold calibrated on this registry (nothing is written)."""
        from . import fingerprint

        with self.store.tx() as tx:
            encoder_id = _active_encoder(tx, as_of)
            self._pool(tx, as_of)  # an empty registry fails here, before the file is read
            cal = fingerprint.calibration(tx)
            vector, _, _ = self._embed_file(tx, evals, encoder_id)
            return fingerprint.verdict(self._similar_by_vector(tx, vector, 2, encoder_id, as_of), cal)

    def calibration(self, sample: int | None = None, draws: int = 3):
        """The same-model threshold and how well it separates same from different models (`fingerprint.Calibration`)."""
        from . import fingerprint

        with self.store.tx() as tx:
            return fingerprint.calibration(tx, sample, draws)

    def portfolio(self, k: int | None = None, method: str = "kmedoids", max_params: float | None = None,
                  max_cost: float | None = None, require=(), exclude=(), target: float | None = None,
                  seed: int = 0, as_of: str | None = None):
        """A few models covering the embedding space (`portfolio.Portfolio`); with `target`, the smallest k whose
        routing accuracy on the test split reaches that share of the whole pool's."""
        from . import geometry, portfolio

        if k is None and target is None:
            raise InputError("give k or a target share (e.g. --target 0.99)")
        with self.store.tx() as tx:
            p = self._pool(tx, as_of)
            meta = {n: (pb, c) for n, pb, c in tx.sql("SELECT name, params_b, cost FROM models")}
            ok, req = portfolio.eligibility(p, meta, exclude, require, max_params, max_cost)
            if target is None:
                members, note = portfolio.select(p, k, method, ok, req, seed)
                return portfolio.describe(p, members, method, note)
            qids, correct = geometry.test_outcomes(tx, p.model_ids)
            probs = geometry.predicted(tx, p.encoder_id, p.vectors, qids)
            return portfolio.smallest_reaching(p, method, ok, req, probs, correct, target, seed)

    def fallback(self, model: str, unavailable=(), k: int = 5, as_of: str | None = None):
        """Substitutes for a model that is down, nearest first, skipping the models marked unavailable and those
        named in `unavailable` (`fallback.Chain`)."""
        from . import fallback, routing

        with self.store.tx() as tx:
            p = self._pool(tx, as_of)
            fallback.check_names(p, [model], "")
            fallback.check_names(p, unavailable, "--unavailable")
            down = set(unavailable) | set(routing.unavailable_models(tx))    # marked unavailable, or named now
            vi = index.get(tx, self.path, p.encoder_id, as_of)
            links = fallback.chains(vi, p, k, down, only=[p.names.index(model)])[model]
        if not links:
            raise InputError(f"no available substitute for {model!r}: every other model is unavailable")
        return fallback.Chain(model, links, sorted(down))

    def fallback_all(self, unavailable=(), k: int = 5, as_of: str | None = None):
        """Every model's fallback chain, in one batched search (`fallback.Chains`): what a gateway loads. Skips the
        models marked unavailable and those named in `unavailable`."""
        from . import fallback, routing

        with self.store.tx() as tx:
            p = self._pool(tx, as_of)
            fallback.check_names(p, unavailable, "--unavailable")
            down = set(unavailable) | set(routing.unavailable_models(tx))
            vi = index.get(tx, self.path, p.encoder_id, as_of)
            return fallback.Chains(fallback.chains(vi, p, k, down), sorted(down))

    def map(self, out: str = "map.png", seed: int = 0, as_of: str | None = None):
        """Draw the embeddings in 2-D (t-SNE; PCA for tiny registries), coloured by family (`maps.MapResult`)."""
        from . import maps

        with self.store.tx() as tx:
            p = self._pool(tx, as_of)
            families = dict(tx.sql("SELECT name, family FROM models"))
        return maps.render(p, families, out, seed)

    def geometry(self, min_shared: int = 10, as_of: str | None = None):
        """Pearson and Spearman correlation of embedding distance with disagreement on test queries
        (`geometry.Geometry`)."""
        from . import geometry

        with self.store.tx() as tx:
            return geometry.correlation(tx, self._pool(tx, as_of), min_shared)

    def _embed_file(self, tx: Tx, evals: str, encoder_id: int):
        """Embed results of an unregistered model from a file, inside a transaction that the caller rolls back."""
        probe = "__probe__"
        tx.sql("INSERT INTO models (name, tags) VALUES (?, '{}'::JSON) RETURNING id", [probe])
        imported = ingest.run_model_import(tx, probe, str(evals))
        model_id = tx.sql("SELECT id FROM models WHERE name = ?", [probe])[0][0]
        model, meta = encoders.load(tx, encoder_id)
        s = onboarding.evaluation_sets(tx, [model_id], imported.batch_id or 0, meta.get("embed_max_set"))[model_id]
        if s.n < self.min_evaluations:
            raise InputError(f"{s.n} evaluations; at least {self.min_evaluations} are needed to embed a model",
                             file=str(evals))
        z = onboarding.compute(tx, model, [s])
        rows = tx.duck.execute("SELECT query_id, correct::INT AS c FROM evaluations WHERE model_id = ?",
                               [model_id]).fetchnumpy()
        tx.session.rollback()  # nothing of the probe is written
        return z[0], np.asarray(rows["query_id"], dtype=np.int64), np.asarray(rows["c"], dtype=np.int64)


def _upsert_model_metadata(tx: Tx, name: str, **fields) -> dict[str, list]:
    """Insert the model if new; set only the metadata fields given (None leaves a field as it is). Returns what
    changed on an existing model: {field: [old, new]} (tags per key, as `tags.KEY`)."""
    tags = fields.pop("tags", None) or {}
    row = tx.sql("SELECT family, provider, params_b, cost, open_weights, tags::VARCHAR FROM models WHERE name = ?",
                 [name])
    if not row:
        onboarding.new_models(tx, tx.sql("INSERT INTO models (name, tags) VALUES (?, ?::JSON) RETURNING id, name",
                                         [name, json.dumps(tags)]))
        tags = {}
    old = dict(zip(("family", "provider", "params_b", "cost", "open_weights"), row[0][:5])) if row else {}
    old_tags = json.loads(row[0][5] or "{}") if row else {}
    sets = {k: v for k, v in fields.items() if v is not None}
    changes = {k: [old.get(k), v] for k, v in sets.items() if row and old.get(k) != v}
    changes.update({f"tags.{k}": [old_tags[k], v] for k, v in tags.items() if k in old_tags and old_tags[k] != v})
    if sets:
        assignments = ", ".join(f"{k} = ?" for k in sets)
        tx.sql(f"UPDATE models SET {assignments} WHERE name = ? RETURNING id", list(sets.values()) + [name])
    if tags:
        tx.sql("UPDATE models SET tags = ?::JSON WHERE name = ? RETURNING id", [json.dumps({**old_tags, **tags}),
                                                                                 name])
    return changes


def _changed_results(tx: Tx, name: str, batch_id: int | None):
    """Results of this import batch that supersede a different stored result of the same (model, query):
    (count, (query id, old, new) of the first) or None."""
    if batch_id is None:
        return None
    rows = tx.sql("""
        SELECT count(*) OVER (), q.external_id, arg_max(o.correct, o.batch_id)::INT, any_value(e.correct)::INT
        FROM evaluations e JOIN models m ON m.id = e.model_id JOIN queries q ON q.id = e.query_id
        JOIN evaluations o ON o.model_id = e.model_id AND o.query_id = e.query_id AND o.batch_id < e.batch_id
        WHERE m.name = ? AND e.batch_id = ? GROUP BY q.external_id ORDER BY q.external_id LIMIT 1""",
                  [name, batch_id])
    return (int(rows[0][0]), tuple(rows[0][1:])) if rows else None


def _duplicate_warning(tx: Tx, name: str, neighbours: list[Neighbour]) -> str | None:
    from . import fingerprint

    if not neighbours:
        return None
    threshold = fingerprint.threshold(tx)
    nearest = neighbours[0]
    if threshold is not None and nearest.distance <= threshold:
        return (f"{name} sits {nearest.distance:.3f} from {nearest.model} (same-model threshold {threshold:.3f}): "
                f"probably the same model under another name")
    return None


def _vector_of(tx: Tx, name: str, encoder_id: int, as_of: str | None = None):
    when = "AND v.created <= ?::TIMESTAMP" if as_of else ""
    row = tx.sql(f"""SELECT v.vector, v.version FROM embedding_versions v JOIN models m ON m.id = v.model_id
                     WHERE m.name = ? AND v.encoder_id = ? {when} ORDER BY v.version DESC LIMIT 1""",
                 [name, encoder_id] + ([as_of] if as_of else []))
    if not row:
        if not tx.sql("SELECT 1 FROM models WHERE name = ?", [name]):
            raise unknown_model(name, _model_names(tx))
        raise NotFound(f"model {name!r} has no embedding under the active encoder"
                       + (f" as of {as_of}" if as_of else "") + " (too few evaluations? run `registry onboard`)")
    import numpy as np

    return np.asarray(row[0][0], dtype=np.float32), row[0][1]


def _disagreement(tx: Tx, model_id: int, others: list[int]) -> dict[int, tuple[int, float]]:
    """How often each of `others` disagrees with `model_id`, over the queries both answered (current evaluations):
    {other id: (shared queries, disagreement rate)}. Reads only these models' rows."""
    rows = onboarding.newest_per_query(tx.duck.execute(
        "SELECT model_id, query_id, correct::INT AS correct, batch_id FROM evaluations WHERE model_id = ?",
        [int(model_id)]).fetchnumpy())
    return _disagreement_rows(tx, rows["query_id"], rows["correct"], [m for m in others if m != model_id])


def _disagreement_rows(tx: Tx, qids, y, others: list[int | None]) -> dict[int, tuple[int, float]]:
    """How often each of `others` disagrees with the answers y [n] on query ids qids [n] (current evaluations of
    the others): {other id: (shared queries, disagreement rate)}."""
    qids, y = np.asarray(qids, dtype=np.int64), np.asarray(y, dtype=np.int64)
    evaluated = tx.cached("evaluated_models", lambda: {r[0] for r in tx.sql(
        "SELECT DISTINCT model_id FROM evaluations")})              # imports of evaluations invalidate it
    others = [int(m) for m in others if m is not None and m in evaluated]
    if not len(qids) or not others:
        return {}
    ids = ", ".join(str(m) for m in others)
    rows = onboarding.newest_per_query(tx.duck.execute(f"""
        SELECT model_id, query_id, correct::INT AS correct, batch_id FROM evaluations
        WHERE model_id IN ({ids})""").fetchnumpy())
    if not len(rows["query_id"]):
        return {}
    size = int(max(rows["query_id"].max(), qids.max())) + 1
    own = np.full(size, -1, dtype=np.int64)                       # the given answer per query id
    own[qids] = y
    out = {}
    for other in others:
        sel = rows["model_id"] == other
        theirs, ours = rows["correct"][sel], own[rows["query_id"][sel]]
        shared = ours >= 0
        if shared.any():
            out[other] = (int(shared.sum()), float(np.mean(theirs[shared] != ours[shared])))
    return out


def _active_encoder(tx: Tx, as_of: str | None = None) -> int:
    encoder_id = encoders.active_id(tx, as_of) if as_of else encoders.ensure_default(tx)
    if encoder_id is None and as_of:
        first = tx.sql("SELECT min(created)::VARCHAR FROM encoder_activations")[0][0]
        if first is not None:
            raise NotFound(f"nothing was registered as of {as_of}: the registry's history starts at {first[:19]}")
    if encoder_id is None:
        raise RegistryError("no active encoder: train one (`registry train`) or install one "
                            "(`registry encoders install FILE`)")
    return encoder_id


def _predicted_category_accuracy(tx: Tx, encoder_id: int, z) -> dict[str, float]:
    """Mean predicted P(correct) per query category, over every query the registry has a vector for."""
    import numpy as np
    import torch

    model, _ = encoders.load(tx, encoder_id)
    qids = np.array([r[0] for r in tx.sql("SELECT id FROM queries ORDER BY id")], dtype=np.int64)
    if not len(qids):
        return {}
    row_of, qmat = querycache.query_vectors(tx, qids)
    q = qmat[[row_of[int(i)] for i in qids]]
    cats = dict(tx.sql("SELECT id, coalesce(category, '(none)') FROM queries"))
    with torch.no_grad():
        p = torch.sigmoid(model.predict_logits(torch.from_numpy(z[None, :]), torch.from_numpy(q)))[0].numpy()
    out: dict[str, list] = {}
    for qid, pq in zip(qids.tolist(), p):
        out.setdefault(cats[qid], []).append(pq)
    return {c: float(np.mean(v)) for c, v in sorted(out.items())}


def _model_names(tx: Tx) -> list[str]:
    return [r[0] for r in tx.sql("SELECT name FROM models")]


def _model_info(cls, row):
    name, n, acc, family, provider, params_b, cost, open_weights, tags, created = row
    return cls(name=name, evaluations=int(n), accuracy=None if acc is None else round(float(acc), 4),
               family=family, provider=provider, params_b=params_b, cost=cost, open_weights=open_weights,
               tags=json.loads(tags) if tags else {}, created=created)
