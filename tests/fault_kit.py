"""Tools of the fault suite (tests/robustness): run ``gdnflow`` as a user does (a new
process), fingerprint the user's files before and after, and check that a
failure is one line naming what went wrong.

Each test in this folder reproduces one way a careful user can lose work or
get an unhelpful answer, and asserts the exit code, the message and that
nothing the user had was changed.
"""
import hashlib
import os
import subprocess
import sys
from pathlib import Path

#: Exit status of usage errors (bad options or values) and of failures.
USAGE_ERROR, FAILURE = 2, 1


def run_gdnflow(*args, cwd, env=None, timeout=300, **popen):
    """Run ``python -m gdnflow.cli ARGS`` in ``cwd`` on NumPy; the CompletedProcess (text)."""
    environment = {**os.environ, "GDNFLOW_DEVICE": "numpy", **(env or {})}
    return subprocess.run([sys.executable, "-m", "gdnflow.cli", *map(str, args)], cwd=cwd,
                          env=environment, capture_output=True, text=True, timeout=timeout,
                          **popen)


def fingerprint(*roots):
    """{path: SHA-256} of every file under ``roots`` (files or folders), to compare before/after."""
    hashes = {}
    for root in map(Path, roots):
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            hashes[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def assert_one_line_error(result, command, *needles, status=FAILURE):
    """``result`` failed with ``status`` and one stderr line ``gdnflow COMMAND: ...`` naming needles."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == status, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"gdnflow {command}: "), lines[0]
    for needle in needles:
        assert str(needle) in lines[0], (needle, lines[0])
    return lines[0]
