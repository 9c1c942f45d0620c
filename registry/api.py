"""The Python API: `Registry`, a thin facade. Each public method is one call of a use case (registry/usecases/: it
opens the transactions over the domain modules and returns their plain dataclasses), or one managed transaction over
one domain function; the CLI (registry/cli/) and the HTTP server mirror them. Each module is imported when a method
first uses it (core/lazy.py): a command pays only for what it calls."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from registry.core.lazy import lazy_modules
from registry.core.store import Store
from registry.core.transaction import Tx
from registry.embedding import MIN_EVALUATIONS
from registry.routing.decision import Decision, RouteOptions

if TYPE_CHECKING:       # the types the methods return (the modules themselves are imported when first used)
    from registry.answers.catalog import ModelDetail, ModelInfo, Stats
    from registry.answers.neighbours import Neighbour
    from registry.answers.versions import Diff, History
    from registry.data.availability import Availability
    from registry.data.endpoints import Endpoint
    from registry.data.import_models_queries import ImportResult
    from registry.data.splits import DrawResult
    from registry.embedding.encoders import EncoderInfo
    from registry.embedding.onboarding import JobOutcome
    from registry.routing.decision import LogEntry

availability, endpoints = lazy_modules("registry.data", "availability endpoints")
catalog, fingerprint, versions = lazy_modules("registry.answers", "catalog fingerprint versions")
evidence, index = lazy_modules("registry.embedding", "evidence index")
(probation_rule,) = lazy_modules("registry.locus", "evidence")
(route_log,) = lazy_modules("registry.routing", "decision")
ask_uc, encoders_uc, evaluate_uc, exchange, importing, models_uc = lazy_modules(
    "registry.usecases", "ask encoders evaluate exchange importing models")
onboard_uc, register_uc, route_uc, verify_uc, watch_uc, verdicts_uc, feedback_uc = lazy_modules(
    "registry.usecases", "onboard register route verify watch endpoint_verdicts traffic.feedback")


def keeps_routing_state(method):
    """A write that may change what routing depends on keeps the routing state after it (refitted and saved where it
    changed: usecases/onboard.py), so that the next route only reads; a server's writer keeps its own instead, in its
    background job."""
    @functools.wraps(method)
    def write(self, *args, **kwargs):
        out = method(self, *args, **kwargs)
        if self.store.save_routing_state:
            self.keep_routing_state()
        return out
    return write


def reads_routing_state(method):
    """A route reads the saved routing state: on a registry that never had one (or whose last writes kept none: a
    server's file, an older version's state) it is built first, once."""
    @functools.wraps(method)
    def read(self, *args, **kwargs):
        self.keep_routing_state()
        return method(self, *args, **kwargs)
    return read


class Registry:
    """A model registry in one DuckDB file (or a PostgreSQL database: `Registry("postgresql://...")`). `Registry(path)`
    opens (and, if new, creates) it; with `create=False` a missing file is an error (NotFound) instead."""

    def __init__(self, path: str | Path | None = None, migrate: bool = True,
                 min_evaluations: int = MIN_EVALUATIONS, create: bool = True, probation_min: int | None = None):
        self.store = Store(path, migrate=migrate, create=create)
        self.path = self.store.path
        self.min_evaluations = min_evaluations
        self.probation_setting = probation_rule.configured_min(probation_min)   # None: the registry's data sets it

    @property
    def probation_min(self) -> int:
        """The probation minimum now, in a read of its own (the use cases read it in their own transaction)."""
        return evidence.store_minimum(self.store, self.probation_setting)

    def _in_tx(self, fn, *args):
        """fn(tx, *args) in one managed transaction of its own (a read, or a write committed on success)."""
        with self.store.tx() as tx:
            return fn(tx, *args)

    def _settings(self) -> dict:
        """The registry's settings every use case that onboards or reads evidence is given."""
        return {"min_evaluations": self.min_evaluations, "probation": self.probation_setting}

    def _min(self) -> dict: return {"min_evaluations": self.min_evaluations}

    def close(self) -> None:
        index.flush(self.store.cache, self.path)
        self.store.close()

    def __enter__(self): return self

    def __exit__(self, *exc): self.close()

    # --- bringing data in -------------------------------------------------------------------------------------
    @keeps_routing_state
    def import_files(self, models: str | None = None, queries: str | None = None, evaluations: str | None = None,
                     splits: str | None = None, *, directory: str | None = None, progress: bool = False,
                     onboard: bool = True, vectors: str | None = None) -> ImportResult:
        """Import any of models (CSV), queries (CSV/JSONL/Parquet), evaluations (long format), splits and query text
        vectors, or a folder laid out like ../shared/data/mmlu-pro (its vectors too). A bad file changes nothing."""
        named = dict(models=models, queries=queries, evaluations=evaluations, splits=splits, vectors=vectors)
        return importing.import_files(self.store, directory, named, min_evaluations=self.min_evaluations,
                                      progress=progress, onboard=onboard)

    def import_harness(self, harness, paths, **o): return self.import_from(paths, harness, **o)
    @keeps_routing_state
    def import_from(self, paths, reader=None, **o):
        return exchange.import_paths(self.store, paths, reader, **self._settings(), **o)
    def reader_for(self, paths: list[str]) -> str: return exchange.reader_for(paths)
    def export_eee(self, directory: str, **o): return exchange.export_eee(self.store, directory, **o)

    def export_vectors(self, path: str, source: str | None = None, dtype: str = "float32"):
        """Write the query text vectors to a Parquet file other registries import (`vector_files.VectorsResult`)."""
        return importing.export_vectors(self.store, path, source, dtype)

    def import_vectors(self, path: str):
        """Add a vector file's vectors, checked whole first: a bad file changes nothing (`VectorsResult`)."""
        return importing.import_vectors(self.store, path)

    @keeps_routing_state
    def draw_splits(self, val: float = 0.1, test: float | None = None, seed: int = 0, by: str = "random",
                    test_categories: list[str] | None = None) -> DrawResult:
        """Give every query without a split one, drawn with `seed` per category (`val` and `test` shares, default 0.1
        each); a split, once set, is kept. `by="category"`: `test_categories` held out whole. Changed models
        re-embed."""
        return importing.draw_splits(self.store, val=val, test=test, seed=seed, by=by,
                                     test_categories=test_categories, min_evaluations=self.min_evaluations)

    @keeps_routing_state
    def register(self, name: str, evals: str, *, family: str | None = None, provider: str | None = None,
                 params_b: float | None = None, cost: float | None = None, open_weights: bool | None = None,
                 tags: dict | None = None, k: int = 5, progress: bool = False, update: bool = False,
                 alias_of: str | None = None):
        """Register a model with its 0/1 results and embed it, in one call (`registration.RegisterResult`). Adding
        results to a registered model is fine; changing its metadata, or results it already has, needs
        `update=True` (old results are kept), and the result says what changed; `alias_of`: it is that model."""
        metadata = dict(family=family, provider=provider, params_b=params_b, cost=cost, open_weights=open_weights,
                        tags=tags)
        return register_uc.register(self.store, name, evals, metadata, k=k, progress=progress, update=update,
                                    alias_of=alias_of, **self._settings())

    @keeps_routing_state
    def ask(self, name: str, **options):
        """Ask NAME's endpoint (or base_url=...) questions, judge the answers (usecases/ask.py: an `AskResult`)."""
        return ask_uc.ask(self.store, name, **self._settings(), **options)

    @reads_routing_state
    def prompt(self, text: str, **options):
        """Send one prompt through the router to the chosen model's endpoint (usecases/ask.py: a `PromptResult`)."""
        return ask_uc.send_prompt(self.store, text, probation=self.probation_setting, **options)

    def probe(self, model: str, n: int = 16, seed: int = 0, out: str | None = None):
        """The next n queries to ask a new or partly evaluated model so that its embedding and its routing settle
        fastest (`probe_plans.ProbePlan`), written to `out` (CSV or JSONL, an empty `correct` column to fill in)
        for `register`. Nothing is written to the registry."""
        return register_uc.probe(self.store, model, n, seed, out, min_evaluations=self.min_evaluations)

    # --- onboarding and versions ------------------------------------------------------------------------------
    @keeps_routing_state
    def onboard(self, all_models: bool = False, stability: bool = True, seconds: dict | None = None,
                sweep: bool = True, prepared: dict | None = None) -> list[JobOutcome]:
        """Run every pending onboarding job (`all_models`: re-embed every model) and write the new versions; then,
        unless `stability` is False, estimate the stability of the versions without one (`finish_stabilities`).
        `seconds` gets each step's time; `prepared`: embeddings a server computed ahead (`onboarding.Prepared`)."""
        return onboard_uc.onboard(self.store, self.min_evaluations, all_models=all_models, stability=stability,
                                  seconds=seconds, sweep=sweep, prepared=prepared)

    def finish_stabilities(self, outcomes: list[JobOutcome], sweep: bool = True) -> bool:
        """After an onboarding: the new versions have their stability (run_pending's); estimate any older version's
        still without one, with `sweep` always, else only when a new version lacks its own. -> whether it ran."""
        return onboard_uc.finish_stabilities(self.store, outcomes, sweep)

    def estimate_stability(self) -> dict[int, float]:
        """{version id: stability} for the versions without one (embeddings of two random halves of its evaluations)."""
        return onboard_uc.estimate_stability(self.store)

    def finish_pending(self) -> list[JobOutcome]:
        """Run the onboarding jobs a crash or an interrupt may have left behind (what every writing command does
        first) -> their outcomes (none: nothing was pending)."""
        return onboard_uc.finish_pending(self.store, self.min_evaluations)

    def history(self, name: str) -> History: return self._in_tx(versions.history, name)

    def diff(self, name: str, v1: int | None = None, v2: int | None = None, k: int = 5) -> Diff:
        """How far a model moved between two versions (default: the two newest), how its nearest neighbours changed
        (as the registry stood at each version), and how its predicted accuracy per category changed."""
        return self._in_tx(versions.diff, name, v1, v2, k)

    def recompute_version(self, name: str, version: int):
        """(stored vector, recomputed vector, digest matches) for one version: versions are reproducible."""
        return self._in_tx(versions.recompute, name, version)

    # --- encoders ---------------------------------------------------------------------------------------------
    def encoders(self) -> list[EncoderInfo]: return encoders_uc.listing(self.store)

    @keeps_routing_state
    def activate_encoder(self, encoder_id: int) -> list[JobOutcome]:
        """Make an encoder active; every model is re-embedded under it (old versions stay), and it becomes active
        when their versions commit: until then (a crash meanwhile) reads answer under the previous one."""
        return encoders_uc.activate(self.store, encoder_id, min_evaluations=self.min_evaluations)

    @keeps_routing_state
    def install_encoder(self, path: str, name: str | None = None, activate: bool = False) -> int:
        return encoders_uc.install(self.store, path, name, activate_it=activate, min_evaluations=self.min_evaluations)

    @keeps_routing_state
    def train(self, *, seed: int = 0, anchors: int | None = None, max_steps: int | None = None,
              epochs: int | None = None, activate: bool = False, name: str | None = None, progress=None,
              category_features: bool = False, category_field: str = "category",
              category_fit: str = "train") -> int:
        """Train a LOCUS encoder on the registry's train split (val for model selection), store it as a checkpoint;
        returns its encoder id. `activate` makes it active (every model is re-embedded). `category_features`: the
        predictor also reads `category_field` ("category", "source", "category+source"; docs/routing.md)."""
        return encoders_uc.train(self.store, min_evaluations=self.min_evaluations, activate_it=activate, seed=seed,
                                 anchors=anchors, max_steps=max_steps, epochs=epochs, name=name, progress=progress,
                                 category_features=category_features, category_field=category_field,
                                 category_fit=category_fit)

    def evaluate(self, split: str = "test", *, baselines: bool = True, sample_efficiency: bool = False,
                 seeds: int | None = None, held_out: int | None = None, n: int = 128,
                 max_steps: int | None = None, epochs: int | None = None, progress=None, planned: bool = False):
        """Routing accuracy and predictor quality of LOCUS on a split, beside the baselines, over the established
        models with an up-to-date embedding (pending onboarding is finished first; the others are reported).
        `held_out=K`: per seed (default 3), K models known only from n evaluations (evaluate/heldout.py; nothing
        written).
        `planned` (with sample_efficiency or held_out): planned probes against random ones (locus/probe_design.py)."""
        return evaluate_uc.evaluate(self.store, split, baselines=baselines, sample_efficiency=sample_efficiency,
                                    seeds=seeds, held_out=held_out, n=n, max_steps=max_steps, epochs=epochs,
                                    progress=progress, planned=planned, **self._settings())

    # --- the database as a whole --------------------------------------------------------------------------------
    def check(self):
        """What is wrong with the database's schema (`dbcheck.SchemaCheck`: `ok`, `problems`): one alembic_version
        row, at this registry's revision (not older, not newer), every table and column there. Reads only; open
        the registry with migrate=False to check a file at any revision."""
        return self.store.check()

    def db_copy(self, dest: str, progress=None):
        """Copy this registry, every table, to `dest` (a new DuckDB file or an empty PostgreSQL database, given by
        URL), losslessly and all or nothing (`dbcopy.CopyResult`); `progress(table, rows)` hears of each table."""
        from registry.core import dbcopy

        return dbcopy.copy(self.store, dest, progress)

    # --- reading: models, neighbours, the embedding space ----------------------------------------------------
    def models(self, *, limit: int | None = None, offset: int = 0) -> list[ModelInfo]:
        """Every model by name (with `limit`, a page of them from `offset` on): evaluations, accuracy, metadata,
        availability, current version and evidence status."""
        return models_uc.models(self.store, self.probation_setting, limit=limit, offset=offset)
    def model_count(self) -> int: return models_uc.model_count(self.store)

    def show(self, name: str) -> ModelDetail: return models_uc.show(self.store, name, self.probation_setting)
    def stats(self, known: tuple | None = None) -> Stats: return self._in_tx(catalog.stats, self.path, known)

    def similar(self, model: str | None = None, k: int = 5, *, evals: str | None = None,
                as_of: str | None = None) -> list[Neighbour]:
        """Nearest registered models to a registered model or to an unregistered one's results (`evals`, read only),
        with how often each disagrees with it on shared queries and each one's evaluations; k past the pool: all."""
        return models_uc.similar(self.store, model, k, evals=evals, as_of=as_of, **self._settings())

    def embedded_from(self, names: list[str], as_of: str | None = None) -> dict[str, int]:
        """The evaluations behind each named model's current embedding (absent: not embedded)."""
        return models_uc.embedded_from(self.store, names, as_of)

    def fingerprint(self, evals: str, as_of: str | None = None):
        """Is the endpoint behind these results a registered model? "same" only when at most 1% of distinct models
        would pass; from shared answers, else the embedding; with its evidence (`fingerprint.Fingerprint`)."""
        return models_uc.fingerprint(self.store, evals, min_evaluations=self.min_evaluations, as_of=as_of)

    def fingerprint_plan(self, n: int = 64, candidates=(), seed: int = 0, out: str | None = None):
        """The n queries whose answers best tell the candidate models apart (default: every model with at least the
        probation minimum of results), written to `out` for `fingerprint --evals` (`probe_plans.FingerprintPlan`)."""
        return models_uc.fingerprint_plan(self.store, n, list(candidates), seed, out, probation=self.probation_setting)

    def calibration(self, sample: int = 128, draws: int = 3):
        """How the fingerprint tests decide "same" (`fingerprint.CalibrationReport`)."""
        return self._in_tx(fingerprint.calibration, sample, draws)

    def pool(self, tx: Tx, as_of: str | None = None):
        """The current embeddings under the active encoder (as of `as_of`), read in the caller's transaction."""
        return models_uc.pool(tx, as_of)

    def portfolio(self, k: int | None = None, method: str | None = None, *, max_params: float | None = None,
                  max_cost: float | None = None, require=(), exclude=(), target: float | None = None,
                  seed: int = 0, as_of: str | None = None, include_probation: bool = False, fill: bool = False):
        """A few models covering the embedding space (`portfolio.Portfolio`); with `target`, the smallest k whose
        routing accuracy as served on test reaches that share of the pool's. Models on probation are members only
        when required or with `include_probation`; by routing value, members that add nothing only with `fill`."""
        return models_uc.portfolio(self.store, k, method, as_of=as_of, include_probation=include_probation,
                                   probation=self.probation_setting, max_params=max_params, max_cost=max_cost,
                                   require=require, exclude=exclude, target=target, seed=seed, fill=fill)

    def fallback(self, model: str, unavailable=(), k: int = 5, as_of: str | None = None,
                 include_probation: bool = False):
        """Substitutes for a model that is down, nearest first, skipping the models marked unavailable, those
        named in `unavailable` and those on probation unless `include_probation` (`fallback.Chain`)."""
        return models_uc.fallback(self.store, model, unavailable, k, as_of=as_of, include_probation=include_probation,
                                  probation=self.probation_setting)

    def fallback_all(self, unavailable=(), k: int = 5, as_of: str | None = None, include_probation: bool = False):
        """Every model's fallback chain, in one batched search (`fallback.Chains`): what a gateway loads."""
        return models_uc.fallback_all(self.store, unavailable, k, as_of=as_of, include_probation=include_probation,
                                      probation=self.probation_setting)

    def map(self, out: str = "map.png", seed: int = 0, as_of: str | None = None):
        """Draw the embeddings in 2-D (PCA up to maps.PCA_MAX models, t-SNE past them), by family (`maps.MapResult`)."""
        return models_uc.map_(self.store, out, seed, as_of)

    def geometry(self, min_shared: int = 10, as_of: str | None = None):
        """Pearson and Spearman correlation of embedding distance with disagreement on test queries."""
        return models_uc.geometry(self.store, min_shared, as_of)

    # --- routing ------------------------------------------------------------------------------------------------
    @reads_routing_state
    def route(self, query: str, options: RouteOptions | None = None) -> Decision:
        """Route one query text: the model most likely to answer it (or the cost-aware choice the options ask for,
        `RouteOptions`), every candidate's P(correct) and evidence, the versions used; logged unless asked not to."""
        return route_uc.route(self.store, query, options, probation=self.probation_setting)

    @reads_routing_state
    def route_batch(self, texts: list[str], options: RouteOptions | None = None, *, reuse_vectors: bool = True,
                    batch_size: int = 64, progress: bool = False) -> list[Decision]:
        """Route many texts (vectors cached or stored where known, the rest MiniLM-encoded in batches) with one bulk
        log insert. `reuse_vectors=False` encodes every text (what benchmarks compare with bare MiniLM)."""
        return route_uc.route_batch(self.store, texts, options, probation=self.probation_setting,
                                    reuse_vectors=reuse_vectors, batch_size=batch_size, progress=progress)

    def keep_routing_state(self) -> None:
        """Bring the routing state up to date with the registry (every write above does it after itself; a route
        before it): refitted and saved where it changed, seconds; a read where it is current."""
        onboard_uc.keep_routing_state(self.store, self.probation_setting)

    def prepare_queries(self, texts: list[str]) -> None:
        """Compute and cache the texts' vectors now (the server does this outside its write lock)."""
        route_uc.prepare_queries(self.store, texts)

    @keeps_routing_state
    def mark_unavailable(self, models: list[str], reason: str | None = None) -> list[Availability]:
        return self._in_tx(availability.set_and_list, list(models), False, reason)

    @keeps_routing_state
    def mark_available(self, models: list[str], reason: str | None = None) -> list[Availability]:
        return self._in_tx(availability.set_and_list, list(models), True, reason)

    def availability(self) -> list[Availability]: return self._in_tx(availability.listing)

    def endpoints(self) -> list[Endpoint]: return list(self._in_tx(endpoints.current).values())

    def set_endpoint(self, model: str, base_url: str, upstream_model: str | None = None,
                     api_key_env: str | None = None) -> Endpoint:
        """Where the routing proxy forwards MODEL's requests; the API key stays in the environment (serve/proxy.py)."""
        return self._in_tx(endpoints.set_endpoint, model, base_url, upstream_model, api_key_env)

    @keeps_routing_state
    def remove_endpoint(self, model: str) -> None:
        """MODEL's endpoint removed; an endpoint claiming another model (a model of its own) is deleted with it."""
        register_uc.remove_endpoint(self.store, model)

    @keeps_routing_state
    def delete(self, name: str, *, reason: str | None = None):
        """Delete a model: it leaves every list and answer; its versions and results stay readable (`history`), and
        the endpoints claiming it go with it (`tidying.Deleted`). A model others are aliases of is refused."""
        return register_uc.delete(self.store, name, reason=reason)

    @keeps_routing_state
    def rename(self, old: str, new: str, *, reason: str | None = None):
        """Call a model by another name: its versions, results and aliases stay its own (`tidying.Renamed`)."""
        return register_uc.rename(self.store, old, new, reason=reason)

    @keeps_routing_state
    def claim(self, model: str, base_url: str, **o): return self._in_tx(verify_uc.claim, model, base_url, o)
    def claims(self): return self._in_tx(verify_uc.claims.current)

    def endpoint_verdicts(self, model: str) -> dict:
        """{endpoint: its verdict now} for every endpoint claiming MODEL: what `verify` and each `watch` round
        report, on the answers since the endpoint's last verdict change (usecases/endpoint_verdicts.py)."""
        self.show(model)        # (an unknown model: NotFound, with suggestions)
        return self._in_tx(verdicts_uc.of_model, model)
    def verify(self, model: str, **o): return verify_uc.verify(self.store, model, **self._min(), **o)
    def watch(self, **o): return watch_uc.watch(self.store, **self._min(), **o)

    @keeps_routing_state
    def feedback(self, file: str, **o): return feedback_uc.feedback(self.store, file, **self._min(), **o)
    @keeps_routing_state
    def feedback_source(self, name: str, **o): return feedback_uc.set_source(self.store, name, **self._min(), **o)
    def feedback_sources(self): return feedback_uc.source_list(self.store)
    def drift(self, model: str | None = None): return feedback_uc.drift(self.store, model)
    def routing_log(self, since: str | None = None, limit: int | None = None,
                    oldest: bool = False) -> list[LogEntry]:
        """Routing log entries, newest first (`oldest`: oldest first); `limit` keeps the first that many."""
        return self._in_tx(route_log.read_log, since, limit, oldest)

    def frontier(self, split: str = "test", cost_by: str = "params", weights: list[float] | None = None):
        """Accuracy vs mean cost (params_b, or cost with cost_by="cost") over a sweep of cost weights, beside every
        single model, with their Pareto frontier and each point's coverage (routing/frontier.py)."""
        return evaluate_uc.frontier(self.store, split, cost_by, weights, probation=self.probation_setting)
