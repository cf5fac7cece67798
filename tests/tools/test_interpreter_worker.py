"""The interpreter process the CPU kernel tests share: scripts run in turn with their own names and argv,
a failing script fails with its traceback, a crashed or hung worker is replaced for the next script."""

from __future__ import annotations

import pytest

from autotaxer.testing.interpreter import InterpreterError, InterpreterWorker


def test_scripts_run_in_turn_and_failures_name_their_cause() -> None:
    with InterpreterWorker() as worker:
        script = "import os, sys; print(os.environ['TRITON_INTERPRET'], sys.argv[1:])"
        assert worker.run(script, argv=("a",)) == "1 ['a']\n"
        assert worker.run("print('x' in globals())") == "False\n"  # a fresh namespace per script
        with pytest.raises(InterpreterError, match=r"(?s)before\n.*ZeroDivisionError"):
            worker.run("print('before')\n1 / 0")
        with pytest.raises(InterpreterError, match="worker died .exit code 3.:\n.*going"):
            worker.run("import os, sys; print('going', file=sys.stderr, flush=True); os._exit(3)")
        with pytest.raises(InterpreterError, match="did not finish within 1 s"):
            worker.run("import time; time.sleep(30)", timeout=1)
        assert worker.run("print('again')") == "again\n"  # a fresh worker after each death
