"""Import formats as readers in one table: the command line's --from choices, its help and docs/input-files.md are
built from it; `registry import PATH` picks the reader that recognises the files and says which; a reader another
package declares by entry point (`locus_registry.readers`) is listed and imports its files, with no change to the
registry's code (a test package made here: a *.dist-info with entry_points.txt on PYTHONPATH, the CLI in a
subprocess)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from registry.cli import cli
from registry.data.formats import readers
from tests.conftest import snapshot

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = str(Path(sys.executable).with_name("registry"))

PLUGIN = '''
"""A reader of `.answers` files: one JSON line per answer (model, question, options, correct)."""
import json

from registry.data.formats.readers import Reader, Run, Sample


def recognises(paths):
    return all(p.endswith(".answers") for p in paths)


def read(paths, *, model=None, threshold=None, progress=False):
    runs = []
    for p in paths:
        rows = [json.loads(line) for line in open(p)]
        run = Run(p, model or rows[0]["model"])
        for i, r in enumerate(rows):
            run.samples.append(Sample(str(i), r["question"], r["options"], "answers-task", None, r["correct"] == 1))
        runs.append(run)
    return runs


READER = Reader("answers", "one JSON line per answer (model, question, options, correct)", recognises, read,
                ("threshold",))
'''


def plugin_path(tmp_path: Path) -> Path:
    """A package `answers_reader` installed as a distribution would be: its module and a dist-info naming its entry
    point."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "answers_reader.py").write_text(PLUGIN)
    info = site / "answers_reader-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: answers-reader\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{readers.ENTRY_POINT_GROUP}]\nanswers = answers_reader:READER\n")
    broken = site / "broken_reader-0.1.dist-info"      # a second package, whose module is missing
    broken.mkdir()
    (broken / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-reader\nVersion: 0.1\n")
    (broken / "entry_points.txt").write_text(f"[{readers.ENTRY_POINT_GROUP}]\nbroken = no_such_module:READER\n")
    return site


def registry_cli(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}"}
    return subprocess.run([REGISTRY, *args], capture_output=True, text=True, env=env, timeout=300)


def test_the_table_makes_the_choices_the_help_and_the_docs():
    names = list(readers.table())
    assert names[:5] == ["csv", "inspect", "lm-eval", "eee", "helm"]
    r = CliRunner().invoke(cli, ["import", "--help"])
    assert r.exit_code == 0
    for reader in readers.table().values():
        assert reader.name in r.output and reader.summary.split(" (")[0][:30] in " ".join(r.output.split())
    r = CliRunner().invoke(cli, ["--db", "x.duckdb", "import", "--from", "nope", "a"])
    assert r.exit_code == 2 and "'nope' is not one of 'csv', 'inspect', 'lm-eval', 'eee', 'helm'" in r.output
    docs = (ROOT / "docs" / "input-files.md").read_text()
    assert readers.markdown() in docs, "docs/input-files.md: paste readers.markdown()'s table"


def test_import_without_from_says_which_reader(db_copy, small_data, tmp_path):
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "import", str(small_data)])
    assert r.exit_code == 0 and r.output.splitlines()[0] == "already imported (batch 1): nothing added"  # the folder
    assert r.output.splitlines()[1] == f"{db_copy}: 31 models, 160 queries, 4,943 evaluations"     # what it holds
    (tmp_path / "notes.txt").write_text("nothing to read\n")
    before = snapshot(db_copy)
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "import", str(tmp_path)])
    assert r.exit_code == 1 and "no reader recognises" in r.output and "give --from FORMAT" in r.output
    assert len([ln for ln in r.output.splitlines() if ln.startswith("Error")]) == 1
    assert snapshot(db_copy) == before


@pytest.mark.slow
def test_a_reader_from_another_package_is_listed_and_imports(db_copy, small_data, tmp_path):
    from tests.test_harness_import import questions_and_llama

    site = plugin_path(tmp_path)
    r = registry_cli(site, "import", "--help")
    assert r.returncode == 0, r.stderr
    assert "answers" in r.stdout and "(from answers-reader)" in " ".join(r.stdout.split())
    assert "(not loaded) the reader plugin 'broken'" in " ".join(r.stdout.split())
    r = registry_cli(site, "--db", str(tmp_path / "x.duckdb"), "import", "--from", "broken", str(site))
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "the reader plugin 'broken' (no_such_module:READER) does not load: ModuleNotFoundError" in r.stderr
    r = registry_cli(site, "--db", str(tmp_path / "x.duckdb"), "import", "--from", "answers", "--scorer", "s", "f")
    assert r.returncode == 1 and "--scorer does not apply to answers" in r.stderr
    qs = questions_and_llama(small_data)[:40]
    data = tmp_path / "run.answers"
    data.write_text("".join(json.dumps({"model": "plugin-model", "question": q["question"], "options": q["options"],
                                        "correct": int(q["llama"])}) + "\n" for q in qs))
    r = registry_cli(site, "--db", str(db_copy), "import", str(data), "--json")    # recognised by the plugin
    assert r.returncode == 0, r.stderr
    done = json.loads(r.stdout)
    assert done["harness"] == "answers" and done["detected"] is True
    assert done["queries_added"] == 0 and done["evaluations_added"] == 40
    assert done["models"][0]["model"] == "plugin-model" and done["models"][0]["matched"] == 40
    # without the package, the format is unknown (nothing of it is in our code)
    r = CliRunner().invoke(cli, ["--db", str(db_copy), "import", "--from", "answers", str(data)])
    assert r.exit_code == 2 and "'answers' is not one of" in r.output
