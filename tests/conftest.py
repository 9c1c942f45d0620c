"""Shared fixtures: a small slice of the real MMLU-Pro data (read from ../shared, never copied into the repo), and a
registry built from it once per session (real DuckDB file, real migrations, real MiniLM vectors); each test gets its
own copy of that file."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import duckdb
import pytest

from registry import Registry

# The suite's registries hold a 160-question slice (about 130 non-test evaluations per model), far under the
# production probation minimum of 500: established at 64 here; the probation tests set their own minimum.
os.environ.setdefault("REGISTRY_PROBATION_MIN", "64")

SHARED = Path(os.environ.get("REGISTRY_TEST_DATA",
                             Path(__file__).resolve().parents[2] / "shared" / "data" / "mmlu-pro"))
EEE = SHARED.parent / "eee"   # Every Eval Ever's schemas and fixtures, HELM run folders among them
N_QUESTIONS = 160


# The fast tier (`-m "not slow"`, the inner loop) must stay under a minute on 2 cores: a test that runs MiniLM or
# starts a `registry serve` process of its own is in the slow tier (both checked here; a module's tests may share
# one server, started by a module fixture), as are tests that take about a second or more there (fitting every
# baseline, waiting out a slow upstream, exporting and importing the whole slice)
_running = {"slow": True}         # whether the test now running is in the slow tier (True between tests)


@pytest.fixture(autouse=True)
def _fast_tier_stays_fast(request, monkeypatch):
    """A test outside the slow tier must not run MiniLM (the tier's budget is a minute): it fails here, naming the
    fix. Every text encoding in this process goes through textvec.encode, which is watched."""
    from registry.locus import text_encoder

    _running["slow"] = request.node.get_closest_marker("slow") is not None

    encoded = []
    original = text_encoder.encode

    def watched(texts, *args, **kwargs):
        if len(texts):
            encoded.append(len(texts))
        return original(texts, *args, **kwargs)

    monkeypatch.setattr(text_encoder, "encode", watched)
    yield
    _running["slow"] = True
    if encoded and request.node.get_closest_marker("slow") is None:
        pytest.fail(f"this test ran MiniLM on {sum(encoded)} texts: mark it @pytest.mark.slow, or use texts the "
                    f"registry already holds")


@pytest.fixture(scope="session")
def mmlu_dir() -> Path:
    if not SHARED.is_dir():  # fail, not skip: a suite that skips its data tests proves nothing
        pytest.fail(f"MMLU-Pro data not found at {SHARED} (set REGISTRY_TEST_DATA)")
    return SHARED


@pytest.fixture(scope="session")
def small_data(tmp_path_factory, mmlu_dir) -> Path:
    """A folder laid out like the shared data: N_QUESTIONS questions (seeded sample) and all their evaluations."""
    out = tmp_path_factory.mktemp("small_data")
    con = duckdb.connect()
    con.execute(f"""CREATE TABLE q AS SELECT * FROM read_csv('{mmlu_dir}/questions.csv.gz')
                    USING SAMPLE reservoir({N_QUESTIONS} ROWS) REPEATABLE (7)""")
    con.execute(f"COPY q TO '{out}/questions.csv.gz' (HEADER, COMPRESSION gzip)")
    con.execute(f"""COPY (SELECT e.* FROM read_csv('{mmlu_dir}/evaluations.csv.gz') e SEMI JOIN q USING (question_id)
                    ORDER BY model, question_id) TO '{out}/evaluations.csv.gz' (HEADER, COMPRESSION gzip)""")
    con.execute(f"""COPY (SELECT s.* FROM read_csv('{mmlu_dir}/splits.csv') s SEMI JOIN q USING (question_id))
                    TO '{out}/splits.csv' (HEADER)""")
    shutil.copy(mmlu_dir / "models.csv", out / "models.csv")
    con.close()
    return out


@pytest.fixture(scope="session")
def base_db(tmp_path_factory, small_data) -> Path:
    """The slice imported, and its routing state built and saved in the file (as the first `route` of a user saves
    it): each test's copy routes from it as a new process does, instead of building it again (about a second)."""
    from registry.routing import fit

    path = tmp_path_factory.mktemp("base") / "base.duckdb"
    with Registry(path) as reg:
        reg.import_files(directory=str(small_data))
        with reg.store.tx() as tx:
            fit.keep(tx)
    return path


@pytest.fixture(scope="session")
def unsplit_db(tmp_path_factory, small_data) -> Path:
    """The same data imported without its splits file: every model embedded from all of its evaluations."""
    path = tmp_path_factory.mktemp("unsplit") / "unsplit.duckdb"
    with Registry(path) as reg:
        reg.import_files(models=str(small_data / "models.csv"), queries=str(small_data / "questions.csv.gz"),
                         evaluations=str(small_data / "evaluations.csv.gz"))
    return path


@pytest.fixture
def db_copy(base_db, tmp_path) -> Path:
    """A private copy of the session's registry file."""
    path = tmp_path / "registry.duckdb"
    shutil.copy(base_db, path)
    return path


def snapshot(path: Path) -> dict[str, tuple]:
    """Every table's rows, summarised: (row count, sum of the rows' hashes). Equal snapshots mean the database holds
    exactly the same rows (the sum counts duplicates, unlike an XOR), computed by DuckDB in one pass per table."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {table: tuple(con.execute(f'SELECT count(*), sum(hash(t)::HUGEINT) FROM "{table}" t').fetchall()[0])
                for (table,) in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()}
    finally:
        con.close()


def start_server(db: Path, token: str | None = None, args: tuple[str, ...] = ()):
    """A real `registry serve` process on a free loopback port, answering /health: -> (process, origin). The caller
    terminates it. Fails (not skips) with the server's output if it does not come up. `args`: more `serve`
    options."""
    import socket
    import subprocess
    import sys
    import time

    import httpx

    if not _running["slow"]:
        pytest.fail("this test starts a server process of its own (2 s or more): mark it @pytest.mark.slow, or "
                    "share its module's server (a module fixture)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "registry", "--db", str(db), "serve", "--port", str(port)]
                            + (["--token", token] if token else []) + list(args),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    origin = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    with httpx.Client(timeout=5) as client:         # (one client: each new one loads the CA bundle)
        while True:
            try:
                if client.get(origin + "/health").status_code == 200:
                    return proc, origin
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail(f"server did not start: {proc.stdout.read()}")
            time.sleep(0.05)



# --- PostgreSQL (issue 14): the same tests on a throwaway server -------------------------------------------------

@pytest.fixture(scope="session")
def pg_server():
    """One throwaway PostgreSQL for the session (tests/pg.py), stopped at the end, also when tests fail. Skipped
    only where no PostgreSQL is installed (`.ci/run` installs it, so CI runs these tests)."""
    from .pg import Server, bin_dir

    if bin_dir() is None:
        pytest.skip("no PostgreSQL binaries under /usr/lib/postgresql/*/bin (apt-get install postgresql)")
    server = Server()
    try:
        yield server
    finally:
        server.stop()


_pg_names = iter(range(10 ** 9))


@pytest.fixture
def pg_url(pg_server) -> str:
    """A fresh, empty PostgreSQL database of its own for one test."""
    return pg_server.create_db(f"t{next(_pg_names)}")


@pytest.fixture(scope="session")
def pg_base(pg_server, small_data) -> str:
    """The session's registry (as base_db) on PostgreSQL: a database that each test copies (CREATE DATABASE ...
    TEMPLATE)."""
    url = pg_server.create_db("base")
    with Registry(url) as reg:
        reg.import_files(directory=str(small_data))
    return "base"


# PostgreSQL variants are in the slow tier: they start a server and copy databases, and the fast tier (the inner
# loop) stays under a minute on DuckDB; the README's test command runs both
@pytest.fixture(params=["duckdb", pytest.param("postgres", marks=pytest.mark.slow)])
def backend(request) -> str:
    """Which database a parametrised test runs on."""
    return request.param


@pytest.fixture
def fresh_db(backend, tmp_path, request) -> str:
    """A new, empty registry location on the test's backend: a file path or a PostgreSQL URL."""
    if backend == "duckdb":
        return str(tmp_path / "registry.duckdb")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def any_db(backend, tmp_path, request) -> str:
    """A private copy of the session's registry on the test's backend (db_copy, or a database copied from
    pg_base)."""
    if backend == "duckdb":
        return str(request.getfixturevalue("db_copy"))
    template = request.getfixturevalue("pg_base")
    server = request.getfixturevalue("pg_server")
    return server.create_db(f"t{next(_pg_names)}", template=template)


def pg_snapshot(url: str) -> dict[str, tuple]:
    """`snapshot` for a PostgreSQL registry: every table's (row count, sum of its rows' md5 hashes)."""
    import psycopg

    with psycopg.connect(url) as conn:
        tables = [r[0] for r in conn.execute("""SELECT table_name FROM information_schema.tables
                                                WHERE table_schema = current_schema() ORDER BY 1""")]
        return {t: tuple(conn.execute(
            f"""SELECT count(*), coalesce(sum(('x' || substr(md5(t::text), 1, 15))::bit(60)::bigint::numeric), 0)
                FROM "{t}" t""").fetchone()) for t in tables}


def any_snapshot(db) -> dict[str, tuple]:
    return pg_snapshot(db) if str(db).startswith("postgresql://") else snapshot(Path(db))


@pytest.fixture
def upstreams():
    """start(...) -> a fake OpenAI-compatible upstream on loopback (tests/http_tools.ChatUpstream), closed after the
    test."""
    from .http_tools import ChatUpstream

    started = []

    def start(*args, **kwargs):
        u = ChatUpstream(*args, **kwargs)
        started.append(u)
        return u
    yield start
    for u in started:
        u.close()
