"""Ctrl-C in an import, as a user presses it: the command says what was committed and what is left (exit 130), a
new file with nothing committed is removed, and the next run embeds what the interrupted one left and says so."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("after", [2.0, 6.0])
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
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert proc.returncode == 130 and len(lines) == 1 and lines[0].startswith("Error: interrupted"), err
    assert "Traceback" not in err and "Aborted!" not in err
    if "nothing was imported" in lines[0]:
        assert not db.exists()                              # a new file with nothing in it is not left behind
        return
    assert "was committed" in lines[0] and "not embedded yet" in lines[0] and db.exists()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "embedded 31 model(s) an earlier, interrupted run left unembedded" in again.stdout
    assert "already imported" in again.stdout
