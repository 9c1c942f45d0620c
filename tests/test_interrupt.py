"""Ctrl-C in an import, as a user presses it: the command says what was committed and what is left (exit 130), a
new file with nothing committed is removed, and the next run embeds what the interrupted one left and says so."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("after", [0.5, 1.0, 2.0, 6.0])
def test_an_interrupted_import_says_what_it_kept(mmlu_dir, tmp_path, after):
    db = tmp_path / "r.duckdb"
    cmd = [sys.executable, "-m", "registry", "--db", str(db), "import", str(mmlu_dir)]
    # SIGINT as a terminal delivers it: a suite started in the background (CI) runs with it ignored, and a child
    # started so would ignore it too
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(after)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip(f"the import finished within {after} s: nothing to interrupt")
    # (before it, the steps the import had announced: "import: reading ...", "routing: refitting ...")
    lines = [ln for ln in err.strip().splitlines() if ln.strip() and not ln.startswith(("import: ", "routing: "))]
    assert proc.returncode == 130 and len(lines) == 1 and lines[0].startswith("Error: interrupted"), err
    assert "Traceback" not in err and "Aborted!" not in err
    if "while starting" in lines[0]:           # (a busy machine: Ctrl-C before the command began) a full run follows
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0 and "already imported" not in again.stdout, again.stderr
        return
    if "nothing was imported" in lines[0]:
        assert not db.exists()                              # a new file with nothing in it is not left behind
        return
    if "the command had finished" in lines[0]:    # Ctrl-C landed where Python could not raise it (a GC callback):
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)     # all of it was kept
        assert again.returncode == 0 and "already imported" in again.stdout, again.stderr
        return
    assert "was committed" in lines[0] and "not embedded yet" in lines[0] and db.exists()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "embedded 31 model(s) an earlier, interrupted run left unembedded" in again.stdout
    assert "already imported" in again.stdout


SCAN = """
import os, signal, sys, threading, time
import pyarrow as pa
from registry.core.store import Store
from registry.core.interrupts import is_interrupt, sigint_stops_statements
store = Store(sys.argv[1])
schema = pa.schema([("x", pa.int64())])
def batches():                                   # Python code that runs inside DuckDB's scan of the stream
    for i in range(10_000):
        time.sleep(0.001)
        yield pa.record_batch([pa.array(range(i * 100, i * 100 + 100))], schema=schema)
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    with sigint_stops_statements():
        with store.tx() as tx:
            with tx.table("src", pa.RecordBatchReader.from_batches(schema, batches())):
                tx.sql("CREATE TEMP TABLE t AS SELECT sum(x) FROM src")
    print("finished")
except BaseException as e:
    print("interrupt" if is_interrupt(e) else f"other: {type(e).__name__}")
"""


def test_ctrl_c_inside_duckdbs_own_calls_into_python_stops_the_statement(tmp_path):
    """Ctrl-C while DuckDB reads an Arrow stream (its own call back into Python): the statement stops as an
    interrupt. Raised inside that call, the KeyboardInterrupt came back as DuckDB's 'reading the stream failed'
    error (or, inside other such calls, aborted the process)."""
    out = subprocess.run([sys.executable, "-c", SCAN, str(tmp_path / "r.duckdb")], capture_output=True, text=True,
                         timeout=120, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert out.returncode == 0 and out.stdout.strip() == "interrupt", (out.stdout, out.stderr[-2000:])


def test_ctrl_c_inside_a_garbage_collectors_callback_prints_no_traceback():
    """A SIGINT that lands in a weakref callback cannot be raised there: Python hands it to sys.unraisablehook,
    which the command line keeps quiet (the command then says it was interrupted, once)."""
    import io
    import weakref
    from contextlib import redirect_stderr

    from registry.cli import quiet_interrupt

    class Thing:
        pass

    def callback(_):
        raise KeyboardInterrupt

    before = sys.unraisablehook
    sys.unraisablehook = quiet_interrupt
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            t = Thing()
            ref = weakref.ref(t, callback)
            del t                           # the callback runs now and raises: an unraisable KeyboardInterrupt
        assert ref() is None and err.getvalue() == ""
        with redirect_stderr(err):          # any other unraisable is still printed
            t = Thing()
            ref = weakref.ref(t, lambda _: 1 / 0)
            del t
        assert "ZeroDivisionError" in err.getvalue()
    finally:
        sys.unraisablehook = before
