"""The REGISTRY_* variables, read in one place (core/settings.py), and the rule for DuckDB's threads: a number of
threads, applied to every DuckDB database of a store when set; unset, DuckDB's default, and 1 in the server."""
from __future__ import annotations

import pytest

from registry.core import settings
from registry.core.errors import InputError
from registry.core.store import Store
from registry.locus import evidence

VARIABLES = ("REGISTRY_DB", "REGISTRY_PROBATION_MIN", "REGISTRY_DUCKDB_THREADS", "REGISTRY_THREADS",
             "REGISTRY_SWITCH_INTERVAL", "REGISTRY_WRITER_NICE", "REGISTRY_TOKEN")


@pytest.fixture
def clean_env(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _threads(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.exec_driver_sql("SELECT current_setting('threads')").scalar())


def test_unset_or_empty_variables_take_their_defaults(clean_env):
    assert settings.current() == settings.Settings()
    assert settings.Settings() == settings.Settings(db="registry.duckdb", probation_min=None, duckdb_threads=None,
                                                    threads=1, switch_interval=0.001, writer_nice=0, token=None)
    for name in VARIABLES:
        clean_env.setenv(name, "")
    assert settings.current() == settings.Settings()
    assert evidence.probation_min() == evidence.PROBATION_MIN


def test_set_variables_are_read_on_every_call(clean_env):
    clean_env.setenv("REGISTRY_DB", "elsewhere.duckdb")
    clean_env.setenv("REGISTRY_PROBATION_MIN", "7")
    clean_env.setenv("REGISTRY_DUCKDB_THREADS", "3")
    clean_env.setenv("REGISTRY_THREADS", "2")
    clean_env.setenv("REGISTRY_SWITCH_INTERVAL", "0.005")
    clean_env.setenv("REGISTRY_WRITER_NICE", "10")
    clean_env.setenv("REGISTRY_TOKEN", "t0ken")
    assert settings.current() == settings.Settings(db="elsewhere.duckdb", probation_min=7, duckdb_threads=3,
                                                    threads=2, switch_interval=0.005, writer_nice=10, token="t0ken")
    assert evidence.probation_min() == 7 and evidence.probation_min(3) == 3     # the CLI's flag wins
    clean_env.setenv("REGISTRY_PROBATION_MIN", "9")
    assert evidence.probation_min() == 9


@pytest.mark.parametrize("name, value, says", [("REGISTRY_DUCKDB_THREADS", "one", "a whole number"),
                                               ("REGISTRY_DUCKDB_THREADS", "0", "at least 1"),
                                               ("REGISTRY_SWITCH_INTERVAL", "fast", "a number"),
                                               ("REGISTRY_PROBATION_MIN", "1.5", "a whole number")])
def test_a_value_that_does_not_parse_is_refused_naming_its_variable(clean_env, name, value, says):
    clean_env.setenv(name, value)
    with pytest.raises(InputError) as err:
        settings.current()
    assert str(err.value).startswith(f"{name} must be {says}") and repr(value) in str(err.value)


def test_duckdb_threads_apply_to_a_store_when_set_and_the_server_defaults_to_one(clean_env, tmp_path, db_copy):
    from fastapi.testclient import TestClient

    from registry.serve.app import create_app

    plain = Store(tmp_path / "plain.duckdb")
    default = _threads(plain)              # DuckDB's own (one per core)
    plain.close()
    for n in {1, 2, default + 1}:
        clean_env.setenv("REGISTRY_DUCKDB_THREADS", str(n))
        store = Store(tmp_path / f"set{n}.duckdb")
        assert _threads(store) == n
        store.limit_duckdb_threads(1)      # what the server asks for: from now on
        assert _threads(store) == 1
        store.close()
    clean_env.delenv("REGISTRY_DUCKDB_THREADS")
    with TestClient(app := create_app(str(db_copy))):
        assert _threads(app.state.server.registry.store) == 1
    clean_env.setenv("REGISTRY_DUCKDB_THREADS", "2")
    with TestClient(app := create_app(str(db_copy))):
        assert _threads(app.state.server.registry.store) == 2


def test_the_cli_reads_the_environment_through_settings_only(clean_env, db_copy):
    """No command lets click read a REGISTRY_* variable of its own: the root's --db default is settings'."""
    import ast
    from pathlib import Path

    from click.testing import CliRunner

    from registry.cli import cli

    cli_dir = Path(__file__).resolve().parents[1] / "registry" / "cli"
    for path in cli_dir.glob("*.py"):
        calls = [k for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call)
                 for k in node.keywords if k.arg in ("envvar", "auto_envvar_prefix")]
        assert not calls, f"{path.name} reads the environment through click"
    clean_env.setenv("REGISTRY_DB", str(db_copy))
    out = CliRunner().invoke(cli, ["stats", "--json"])
    assert out.exit_code == 0 and str(db_copy) in out.output, out.output
    clean_env.setenv("REGISTRY_PROBATION_MIN", "-3x")
    out = CliRunner().invoke(cli, ["models"])
    assert out.exit_code == 1 and "REGISTRY_PROBATION_MIN must be a whole number" in out.output


def test_the_token_comes_from_a_file_and_a_bad_file_is_one_line(tmp_path, monkeypatch):
    token = tmp_path / "token"
    token.write_text("t0ken-from-a-file\n# anything after the first line is not read\n")
    monkeypatch.delenv("REGISTRY_TOKEN", raising=False)
    monkeypatch.setenv("REGISTRY_TOKEN_FILE", str(token))
    assert settings.current().token == "t0ken-from-a-file"
    monkeypatch.setenv("REGISTRY_TOKEN", "from-the-environment")          # the variable itself wins
    assert settings.current().token == "from-the-environment"
    monkeypatch.delenv("REGISTRY_TOKEN")
    for bad, why in [(tmp_path / "missing", "cannot be read"), (tmp_path, "not a regular file"),
                     (tmp_path / "blank", "holds no token")]:
        if bad.name == "blank":
            bad.write_text("\n")
        monkeypatch.setenv("REGISTRY_TOKEN_FILE", str(bad))
        with pytest.raises(InputError) as caught:
            settings.current()
        assert why in str(caught.value) and "REGISTRY_TOKEN_FILE" in str(caught.value)
