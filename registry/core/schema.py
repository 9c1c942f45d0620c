"""The registry's tables, as SQLAlchemy ORM classes. The schema itself is built only by the Alembic migrations in
`alembic/versions/`; a test checks that what they build equals what these classes describe.

DuckDB notes that shape this file (the stack's known quirks):
- no SERIAL/IDENTITY: integer keys come from a named Sequence with a server default;
- no database-level foreign keys: DuckDB forbids ALTERing a referenced table and checks every bulk row, so later
  migrations could only ever add tables. References are kept by our code, inside one transaction per operation;
- evaluations have no primary key or index on purpose: they are bulk-loaded, append-only rows (the newest
  evaluation of a (model, query) pair counts; see the `current_evaluations` view).
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    REAL,
    Boolean,
    CheckConstraint,
    Double,
    Float,
    Integer,
    LargeBinary,
    Sequence,
    String,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import ARRAY, DateTime, UserDefinedType


class FixedVector(UserDefinedType[Any]):
    """DuckDB FLOAT[n]: a fixed-length array, so a vector of the wrong length is refused by the database. On
    PostgreSQL: real[], its length checked by a CHECK constraint (`vector_column`, migration 0007)."""
    cache_ok = True

    def __init__(self, dim: int):
        self.dim = dim

    def get_col_spec(self, **kw: Any) -> str:
        return f"FLOAT[{self.dim}]"


def vector_column(dim: int | None = None) -> Any:
    """A float32 vector column: DuckDB FLOAT[dim] (FLOAT[] without dim), PostgreSQL real[]."""
    base = FixedVector(dim) if dim else ARRAY(Float)
    return base.with_variant(ARRAY(REAL), "postgresql")


class Base(DeclarativeBase):
    pass


def _id(seq_name: str) -> Any:
    seq = Sequence(seq_name)
    return mapped_column(Integer, seq, server_default=seq.next_value(), primary_key=True)


class Model(Base):
    __tablename__ = "models"
    id: Mapped[int] = _id("models_id_seq")
    name: Mapped[str] = mapped_column(String, unique=True, nullable=False)
    family: Mapped[str | None] = mapped_column(String)
    provider: Mapped[str | None] = mapped_column(String)
    params_b: Mapped[float | None] = mapped_column(Double)
    cost: Mapped[float | None] = mapped_column(Double)
    open_weights: Mapped[bool | None] = mapped_column(Boolean)
    tags: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class Query(Base):
    __tablename__ = "queries"
    id: Mapped[int] = _id("queries_id_seq")
    external_id: Mapped[str] = mapped_column(String, unique=True, nullable=False)
    source: Mapped[str | None] = mapped_column(String)
    category: Mapped[str | None] = mapped_column(String)
    text: Mapped[str] = mapped_column(String, nullable=False)  # as embedded: question plus lettered options
    content_hash: Mapped[str] = mapped_column(String, nullable=False)  # sha256 of text
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class QueryAnswer(Base):
    """A query's gold answer, where its queries file had one, and how to grade a reply against it."""
    __tablename__ = "query_answers"
    query_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    answer: Mapped[str] = mapped_column(String, nullable=False)
    # the answer kind (asking/grading.py): letter | letters | number | expression | text ("exact": written before
    # the kinds were told apart; its kind is read from the answer)
    grading: Mapped[str] = mapped_column(String, nullable=False)


class TextVector(Base):
    """One vector per (text, text encoder): a text already embedded is never embedded again."""
    __tablename__ = "text_vectors"
    content_hash: Mapped[str] = mapped_column(String, primary_key=True)
    text_encoder: Mapped[str] = mapped_column(String, primary_key=True)
    vector: Mapped[list[float]] = mapped_column(vector_column(), nullable=False)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class ImportBatch(Base):
    __tablename__ = "import_batches"
    id: Mapped[int] = _id("import_batches_id_seq")
    files: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)  # {"evaluations": "/path/file.csv.gz", ...}
    row_counts: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)  # rows read and rows added, per kind
    digest: Mapped[str] = mapped_column(String, nullable=False)     # sha256 over the files' bytes
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class Evaluation(Base):
    __tablename__ = "evaluations"
    # No primary key in the database (bulk-loaded, append-only); the ORM needs one to map the class.
    __mapper_args__ = {"primary_key": ["model_id", "query_id", "batch_id"]}
    model_id: Mapped[int] = mapped_column(Integer, nullable=False)
    query_id: Mapped[int] = mapped_column(Integer, nullable=False)
    correct: Mapped[bool] = mapped_column(Boolean, nullable=False)
    batch_id: Mapped[int] = mapped_column(Integer, nullable=False)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class QuerySplit(Base):
    """Which queries are train, validation and test, so that every figure is on the same test set."""
    __tablename__ = "query_splits"
    query_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    split: Mapped[str] = mapped_column(String, nullable=False)  # train | val | test


class Encoder(Base):
    """A LOCUS checkpoint: safetensors bytes (config and meta inside), never pickled."""
    __tablename__ = "encoders"
    id: Mapped[int] = _id("encoders_id_seq")
    name: Mapped[str] = mapped_column(String, unique=True, nullable=False)
    text_encoder: Mapped[str] = mapped_column(String, nullable=False)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    # metrics, training-data digest, embedding policy
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    weights: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    weights_sha256: Mapped[str] = mapped_column(String, nullable=False)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class EncoderActivation(Base):
    """Append-only: the newest activation names the active encoder (and `--as-of` can look back)."""
    __tablename__ = "encoder_activations"
    id: Mapped[int] = _id("encoder_activations_id_seq")
    encoder_id: Mapped[int] = mapped_column(Integer, nullable=False)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class EmbeddingVersion(Base):
    """Append-only: a version is never changed or deleted."""
    __tablename__ = "embedding_versions"
    __table_args__ = (UniqueConstraint("model_id", "version"),
                      CheckConstraint("array_ndims(vector) = 1 AND array_length(vector, 1) = 128",
                                      name="embedding_versions_vector_dim").ddl_if(dialect="postgresql"))
    id: Mapped[int] = _id("embedding_versions_id_seq")
    model_id: Mapped[int] = mapped_column(Integer, nullable=False)
    version: Mapped[int] = mapped_column(Integer, nullable=False)           # 1, 2, ... per model
    encoder_id: Mapped[int] = mapped_column(Integer, nullable=False)
    vector: Mapped[list[float]] = mapped_column(vector_column(128), nullable=False)
    n_evaluations: Mapped[int] = mapped_column(Integer, nullable=False)
    digest: Mapped[str] = mapped_column(String, nullable=False)             # sha256 of exactly the evaluations used
    through_batch: Mapped[int] = mapped_column(Integer, nullable=False)     # evaluations of batches <= this one
    # new evaluations | new encoder | test split changed | manual
    reason: Mapped[str] = mapped_column(String, nullable=False)
    batch_id: Mapped[int | None] = mapped_column(Integer)                   # the import batch that triggered it
    stability: Mapped[float | None] = mapped_column(Double)                 # before 0005 only: see VersionStability
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class VersionStability(Base):
    """A version's stability estimate (distance between the embeddings of two random halves of its evaluations),
    written just after the version: onboarding does not wait for it."""
    __tablename__ = "version_stability"
    version_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    stability: Mapped[float] = mapped_column(Double, nullable=False)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class OnboardingJob(Base):
    """The outbox: written in the same transaction as the evaluations that call for a new embedding."""
    __tablename__ = "onboarding_jobs"
    id: Mapped[int] = _id("onboarding_jobs_id_seq")
    model_id: Mapped[int] = mapped_column(Integer, nullable=False)
    reason: Mapped[str] = mapped_column(String, nullable=False)
    batch_id: Mapped[int | None] = mapped_column(Integer)
    encoder_id: Mapped[int | None] = mapped_column(Integer)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class OnboardingResult(Base):
    """A job is done when it has a result (append-only, so a crash can never leave a job half-updated)."""
    __tablename__ = "onboarding_results"
    job_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    outcome: Mapped[str] = mapped_column(String, nullable=False)   # embedded | unchanged | too few evaluations
    version_id: Mapped[int | None] = mapped_column(Integer)
    finished: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class ModelAvailability(Base):
    """Append-only: the newest row per model says whether routing may choose it (no row: available)."""
    __tablename__ = "model_availability"
    id: Mapped[int] = _id("model_availability_id_seq")
    model_id: Mapped[int] = mapped_column(Integer, nullable=False)
    available: Mapped[bool] = mapped_column(Boolean, nullable=False)
    reason: Mapped[str | None] = mapped_column(String)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class ModelEndpoint(Base):
    """Append-only: the newest row per model says where the routing proxy sends its requests (base_url NULL: none).
    The API key is never stored: only the name of the environment variable that holds it."""
    __tablename__ = "model_endpoints"
    id: Mapped[int] = _id("model_endpoints_id_seq")
    model_id: Mapped[int] = mapped_column(Integer, nullable=False)
    base_url: Mapped[str | None] = mapped_column(String)
    upstream_model: Mapped[str | None] = mapped_column(String)
    api_key_env: Mapped[str | None] = mapped_column(String)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class ModelAlias(Base):
    """Append-only: the newest row per model says which model it is another name of (alias_of NULL: none), and who
    said so (source: "registration", its answers passed the same-model test; "user")."""
    __tablename__ = "model_aliases"
    id: Mapped[int] = _id("model_aliases_id_seq")
    model_id: Mapped[int] = mapped_column(Integer, nullable=False)
    alias_of: Mapped[int | None] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String, nullable=False)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class AskedAnswer(Base):
    """Append-only: one row per answer an endpoint gave when the registry asked it (`registry ask`), with where it
    came from; its 0/1 result is also an evaluation of the same import batch. The raw text only when asked to keep
    it."""
    __tablename__ = "asked_answers"
    __mapper_args__ = {"primary_key": ["model_id", "query_id", "batch_id"]}
    model_id: Mapped[int] = mapped_column(Integer, nullable=False)
    query_id: Mapped[int] = mapped_column(Integer, nullable=False)
    batch_id: Mapped[int] = mapped_column(Integer, nullable=False)
    base_url: Mapped[str] = mapped_column(String, nullable=False)
    upstream_model: Mapped[str | None] = mapped_column(String)
    template: Mapped[str] = mapped_column(String, nullable=False)     # the prompt template's version
    extracted: Mapped[str | None] = mapped_column(String)             # the answer read (None: unparseable)
    correct: Mapped[bool] = mapped_column(Boolean, nullable=False)
    response_hash: Mapped[str] = mapped_column(String, nullable=False)  # sha256 of the response text
    response: Mapped[str | None] = mapped_column(String)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class ModelChange(Base):
    """Append-only: a model deleted (its `models` row kept whole in `record`; its versions and results stay under its
    id) or renamed (`name` before, `new_name` after)."""
    __tablename__ = "model_changes"
    id: Mapped[int] = _id("model_changes_id_seq")
    model_id: Mapped[int] = mapped_column(Integer, nullable=False)
    change: Mapped[str] = mapped_column(String, nullable=False)       # "deleted" | "renamed"
    name: Mapped[str] = mapped_column(String, nullable=False)
    new_name: Mapped[str | None] = mapped_column(String)
    record: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    reason: Mapped[str | None] = mapped_column(String)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class ModelClaim(Base):
    """Append-only, as aliases are: the newest row per model says which registered model its endpoint claims to serve
    (claims NULL: none now), whether it is that model's reference (the official API) and whether `watch` asks it."""
    __tablename__ = "model_claims"
    id: Mapped[int] = _id("model_claims_id_seq")
    model_id: Mapped[int] = mapped_column(Integer, nullable=False)
    claims: Mapped[int | None] = mapped_column(Integer)
    reference: Mapped[bool] = mapped_column(Boolean, nullable=False)
    watched: Mapped[bool] = mapped_column(Boolean, nullable=False)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class WatchRound(Base):
    """One row per claiming endpoint per `registry watch` round: its figures against the reference on the round's
    questions, the sequential test's statistic after it, the verdict, and the event it raised (NULL: none)."""
    __tablename__ = "watch_rounds"
    id: Mapped[int] = _id("watch_rounds_id_seq")
    model_id: Mapped[int] = mapped_column(Integer, nullable=False)
    claims: Mapped[int] = mapped_column(Integer, nullable=False)
    batch_id: Mapped[int | None] = mapped_column(Integer)         # the round's answers (NULL: nothing new asked)
    n: Mapped[int] = mapped_column(Integer, nullable=False)        # questions both it and the reference answered
    correct: Mapped[int] = mapped_column(Integer, nullable=False)
    reference_correct: Mapped[int] = mapped_column(Integer, nullable=False)
    disagreements: Mapped[int] = mapped_column(Integer, nullable=False)
    worse: Mapped[int] = mapped_column(Integer, nullable=False)    # it wrong where the reference is right
    better: Mapped[int] = mapped_column(Integer, nullable=False)
    statistic: Mapped[float] = mapped_column(Float, nullable=False)
    verdict: Mapped[str] = mapped_column(String, nullable=False)
    event: Mapped[str | None] = mapped_column(String)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class WatchDelivery(Base):
    """One row per event `registry watch` raised for a webhook: kept undelivered (`delivered` NULL) until the webhook
    takes it, each round sending what is still undelivered first."""
    __tablename__ = "watch_deliveries"
    id: Mapped[int] = _id("watch_deliveries_id_seq")
    url: Mapped[str] = mapped_column(String, nullable=False)
    event: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    attempts: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    last_error: Mapped[str | None] = mapped_column(String)
    delivered: Mapped[datetime | None] = mapped_column(DateTime)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class RoutingState(Base):
    """A routing state as built (routing/saved_state.py), under the key that says which registry state it is of: a
    cache of derived values, rebuilt whenever missing."""
    __tablename__ = "routing_states"
    key: Mapped[str] = mapped_column(String, primary_key=True)
    encoder_id: Mapped[int] = mapped_column(Integer, nullable=False)
    payload: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class RoutingLog(Base):
    """One row per routed query (bulk-appended with Arrow for a batch). Model names, not ids: the log must read the
    same after a model is renamed or gone."""
    __tablename__ = "routing_log"
    id: Mapped[int] = _id("routing_log_id_seq")
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)
    query_hash: Mapped[str] = mapped_column(String, nullable=False)   # sha256 of the query text
    text: Mapped[str | None] = mapped_column(String)                  # NULL under --no-log-text
    model: Mapped[str | None] = mapped_column(String)                 # NULL when no model could be chosen
    fallback: Mapped[bool] = mapped_column(Boolean, nullable=False)
    candidates: Mapped[list[Any]] = mapped_column(JSON, nullable=False)    # top candidates [{"model", "prob"}]
    encoder_id: Mapped[int | None] = mapped_column(Integer)
    versions: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)      # model -> embedding version used
    options: Mapped[dict[str, Any] | None] = mapped_column(JSON)                # cost_weight, min_prob, unavailable


class ProxyRequest(Base):
    """One row per request the routing proxy routed with model `auto` and an upstream answered: the id it returned,
    which feedback names (traffic/requests.py). The text only where the owner keeps texts (`serve --keep-texts`),
    else only its hash; the query's text vector as float32 bytes."""
    __tablename__ = "proxy_requests"
    id: Mapped[str] = mapped_column(String, primary_key=True)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)
    model: Mapped[str | None] = mapped_column(String)                 # the model that answered
    chosen: Mapped[str | None] = mapped_column(String)                # the routed choice (another: a fallback)
    category: Mapped[str | None] = mapped_column(String)              # the query's category, or its neighbours'
    query_hash: Mapped[str] = mapped_column(String, nullable=False)
    text: Mapped[str | None] = mapped_column(String)
    vector: Mapped[bytes | None] = mapped_column(LargeBinary)
    predicted: Mapped[float | None] = mapped_column(Double)           # routing's P(correct) of the answering model
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    cost: Mapped[float | None] = mapped_column(Double)                # the answering model's price per query
    encoder_id: Mapped[int | None] = mapped_column(Integer)


class Feedback(Base):
    """At most one outcome per proxied request (its key): the score as given and the 0/1 result it became at its
    source's threshold, which is also an evaluation of that model on the request's production query (`batch_id`)."""
    __tablename__ = "feedback"
    request_id: Mapped[str] = mapped_column(String, primary_key=True)
    model_id: Mapped[int] = mapped_column(Integer, nullable=False)
    query_id: Mapped[int] = mapped_column(Integer, nullable=False)
    batch_id: Mapped[int] = mapped_column(Integer, nullable=False)
    source: Mapped[str] = mapped_column(String, nullable=False)
    outcome: Mapped[float] = mapped_column(Double, nullable=False)
    correct: Mapped[bool] = mapped_column(Boolean, nullable=False)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class FeedbackSource(Base):
    """Append-only: the newest row per name is a feedback source's setting (no row: weight 1, threshold 0.5, on)."""
    __tablename__ = "feedback_sources"
    id: Mapped[int] = _id("feedback_sources_id_seq")
    name: Mapped[str] = mapped_column(String, nullable=False)
    weight: Mapped[float] = mapped_column(Double, nullable=False)
    threshold: Mapped[float] = mapped_column(Double, nullable=False)
    enabled: Mapped[bool] = mapped_column(Boolean, nullable=False)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)


class DriftEvent(Base):
    """A drop the sequential test found in a model's production outcomes on one category against what routing
    predicted for them (traffic/drift.py), with its evidence. Model names, as the routing log keeps them."""
    __tablename__ = "drift_events"
    id: Mapped[int] = _id("drift_events_id_seq")
    model: Mapped[str] = mapped_column(String, nullable=False)
    category: Mapped[str] = mapped_column(String, nullable=False)
    drop: Mapped[float] = mapped_column(Double, nullable=False)       # expected minus observed since the change
    statistic: Mapped[float] = mapped_column(Double, nullable=False)  # the CUSUM when it crossed its threshold
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, nullable=False)
    created: Mapped[datetime] = mapped_column(DateTime, server_default=func.now(), nullable=False)
