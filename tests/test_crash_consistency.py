"""What a crash or a failed write leaves behind stays consistent: an encoder switch cut short by a SIGKILL leaves the
previous encoder answering (and `onboard` completes the switch); a registration whose embedding cannot be written
(a full disk) says in one line what it committed, and `onboard` finishes it."""
from __future__ import annotations

import errno
import signal
import subprocess
import sys

import duckdb
import pytest
import sqlalchemy.exc
from click.testing import CliRunner

from registry import Registry
from registry.cli import cli
from tests.helpers import results_of, write_rows

# the re-embedding of an activation hangs once it has begun (its first forward pass), so the kill lands between
# the activation and the commit of its embeddings, every time
ACTIVATE_THEN_HANG = """
import sys, time
from registry import Registry
from registry.embedding import onboarding

def hang(*args, **kwargs):
    print("embedding", flush=True)
    time.sleep(600)

onboarding.embed_sets = hang
reg = Registry(sys.argv[1])
print("go", flush=True)
reg.activate_encoder(int(sys.argv[2]))
print("done", flush=True)
"""


def activate_and_kill(db, encoder_id: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", ACTIVATE_THEN_HANG, str(db), str(encoder_id)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "go"
        assert proc.stdout.readline().strip() == "embedding"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def active_encoder(db) -> int:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT encoder_id FROM encoder_activations ORDER BY id DESC LIMIT 1").fetchone()[0]
    finally:
        con.close()


@pytest.mark.slow     # trains a tiny encoder and starts a process
def test_a_crash_during_an_encoder_switch_leaves_the_previous_encoder_answering(db_copy):
    with Registry(db_copy) as reg:
        old = next(e.id for e in reg.encoders() if e.active)
        before = [(n.model, round(n.distance, 6)) for n in reg.similar("gemma-7b", k=5)]
        new = reg.train(seed=1, max_steps=2, name="switch-test-encoder")
    activate_and_kill(db_copy, new)
    assert active_encoder(db_copy) == old
    with Registry(db_copy) as reg:        # every read answers as before, under the previous encoder
        assert [(n.model, round(n.distance, 6)) for n in reg.similar("gemma-7b", k=5)] == before
        assert reg.show("gemma-7b").version is not None
        assert next(e.id for e in reg.encoders() if e.active) == old
        reg.route("What is the derivative of x squared?")
        outcomes = reg.onboard()          # the switch the crash cut short, completed
        assert sum(o.outcome == "embedded" for o in outcomes) == 31
        assert next(e.id for e in reg.encoders() if e.active) == new
        assert reg.history("gemma-7b").versions[-1].encoder_id == new
        assert reg.history("gemma-7b").versions[-1].reason == "new encoder"
        assert len(reg.similar("gemma-7b", k=30)) == 30
    assert active_encoder(db_copy) == new


@pytest.mark.slow
def test_activating_the_current_encoder_again_cancels_a_switch_a_crash_left_pending(db_copy):
    with Registry(db_copy) as reg:
        old = next(e.id for e in reg.encoders() if e.active)
        new = reg.train(seed=1, max_steps=2, name="switch-test-encoder")
    activate_and_kill(db_copy, new)
    out = CliRunner().invoke(cli, ["--db", str(db_copy), "encoders", "activate", str(old)])
    assert out.exit_code == 0, out.output
    with Registry(db_copy) as reg:
        reg.onboard()
        assert next(e.id for e in reg.encoders() if e.active) == old
        assert {v.encoder_id for v in reg.history("gemma-7b").versions} == {old}
    out = CliRunner().invoke(cli, ["--db", str(db_copy), "encoders", "activate", str(new)])
    assert out.exit_code == 0, out.output
    assert "31 models re-embedded" in out.output
    assert active_encoder(db_copy) == new


def test_activating_an_encoder_in_a_registry_without_models_takes_effect_at_once(tmp_path):
    with Registry(tmp_path / "empty.duckdb") as reg:
        first = next(e.id for e in reg.encoders() if e.active)
        assert reg.activate_encoder(first) == []
        assert next(e.id for e in reg.encoders() if e.active) == first


def counts(db) -> tuple[int, int, int, int]:
    """models, evaluations, pending onboarding jobs, embedding versions"""
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("""SELECT (SELECT count(*) FROM models), (SELECT count(*) FROM evaluations),
                                     (SELECT count(*) FROM onboarding_jobs j WHERE NOT EXISTS
                                        (SELECT 1 FROM onboarding_results r WHERE r.job_id = j.id)),
                                     (SELECT count(*) FROM embedding_versions)""").fetchone()
    finally:
        con.close()


FULL_DISK = [OSError(errno.ENOSPC, "No space left on device"),
             duckdb.IOException('IO Error: Could not write file "registry.duckdb.wal": No space left on device'),
             # (what the commit raises: SQLAlchemy wraps the driver's error)
             sqlalchemy.exc.OperationalError("COMMIT", None, duckdb.IOException(
                 'IO Error: Could not write file "registry.duckdb.wal": No space left on device'))]


@pytest.mark.parametrize("failure", FULL_DISK, ids=["oserror", "duckdb", "commit"])
def test_register_on_a_full_disk_says_in_one_line_what_it_committed(db_copy, small_data, tmp_path, monkeypatch,
                                                                      failure):
    from registry.embedding import onboarding

    real = onboarding.run_pending

    def full_disk(tx, *args, **kwargs):     # the embedding is computed and written, then the disk is full
        real(tx, *args, **kwargs)
        raise failure

    rows = results_of(small_data, "Yi-6B")[:64]
    f = write_rows(tmp_path / "new.csv", rows)
    models, evaluations, jobs, versions = counts(db_copy)
    monkeypatch.setattr(onboarding, "run_pending", full_disk)
    out = CliRunner().invoke(cli, ["--db", str(db_copy), "register", "disk-full-model", "--evals", str(f)])
    assert out.exit_code == 1
    assert "Traceback" not in out.output and len(out.output.strip().splitlines()) == 1, out.output
    assert "registered 'disk-full-model' and its 64 evaluations, but embedding it failed: " in out.output
    assert "No space left on device; run `registry onboard` when there is room" in out.output
    assert counts(db_copy) == (models + 1, evaluations + 64, jobs + 1, versions)
    monkeypatch.setattr(onboarding, "run_pending", real)
    out = CliRunner().invoke(cli, ["--db", str(db_copy), "onboard"])
    assert out.exit_code == 0, out.output
    assert counts(db_copy) == (models + 1, evaluations + 64, jobs, versions + 1)
    with Registry(db_copy) as reg:
        assert reg.show("disk-full-model").version == 1


@pytest.mark.parametrize("failure", FULL_DISK + [PermissionError(errno.EACCES, "Permission denied", "x.duckdb")],
                         ids=["oserror", "duckdb", "commit", "permission"])
def test_an_io_failure_reaching_the_cli_is_one_line(db_copy, monkeypatch, failure):
    from registry.embedding import onboarding

    def failing(tx, *args, **kwargs):
        raise failure

    monkeypatch.setattr(onboarding, "run_pending", failing)
    out = CliRunner().invoke(cli, ["--db", str(db_copy), "onboard", "--all"])
    assert out.exit_code == 1
    assert out.exception is None or isinstance(out.exception, SystemExit), out.exception
    assert len(out.output.strip().splitlines()) == 1 and out.output.startswith("Error: "), out.output
    assert ("No space left on device" if failure in FULL_DISK else "Permission denied: x.duckdb") in out.output


def test_other_errors_still_show_their_trace(db_copy, monkeypatch):
    from registry.embedding import onboarding

    def bug(tx, *args, **kwargs):
        raise ZeroDivisionError("a bug of ours")

    monkeypatch.setattr(onboarding, "run_pending", bug)
    out = CliRunner().invoke(cli, ["--db", str(db_copy), "onboard"])
    assert isinstance(out.exception, ZeroDivisionError)
