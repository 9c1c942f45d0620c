"""Helpers the test modules share: the CLI run in-process through click's CliRunner (`run`, `run_json`,
`run_import`), and results files made from the shipped slice (`results_of`, `write_rows`, `invented`)."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
from click.testing import CliRunner, Result

from registry.cli import cli


def run(db, *args, env: dict | None = None, catch_exceptions: bool = False) -> Result:
    """`registry --db DB ARGS...` in this process. An exception that is not the CLI's own error propagates (a bug
    shows as its traceback) unless `catch_exceptions`."""
    return CliRunner().invoke(cli, ["--db", str(db), *map(str, args)], env=env, catch_exceptions=catch_exceptions)


def run_json(db, *args, **kwargs) -> dict | list:
    """`run` with --json, which must succeed: its printed JSON."""
    res = run(db, *args, "--json", **kwargs)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)     # (progress lines go to stderr)


def run_import(db, *args, **kwargs) -> Result:
    """`registry --db DB import ARGS...`."""
    return run(db, "import", *args, **kwargs)


def results_of(small_data, model: str) -> list[tuple[str, int]]:
    """A model's (question id, correct) rows in a data folder, by question id."""
    con = duckdb.connect()
    rows = con.execute(f"""SELECT question_id::VARCHAR, correct::INT FROM read_csv('{small_data}/evaluations.csv.gz')
                           WHERE model = ? ORDER BY question_id""", [model]).fetchall()
    con.close()
    return rows


def write_rows(path: Path, rows, header: str = "question_id,correct") -> Path:
    path.write_text(header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


def invented(small_data, tmp_path: Path, n: int = 50, *, wrong_at: int = 0) -> Path:
    """A made-up model with n results, 90% right (a strong model with little evidence): wrong on every tenth
    question from `wrong_at` on (another `wrong_at`, another model: the same answers would make it an alias)."""
    qids = [q for q, _ in results_of(small_data, "gpt-4o-2024-05-13")][:n]
    return write_rows(tmp_path / "invented.csv", [(q, int(i % 10 != wrong_at)) for i, q in enumerate(qids)])


def one_line_error(res: Result) -> str:
    """The output of a failed command, checked to be one `Error:` line."""
    assert res.exit_code == 1, res.output
    text = res.output.strip()
    assert "\n" not in text and text.startswith("Error: "), text
    return text
