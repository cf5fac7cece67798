"""Triton's interpreter (``TRITON_INTERPRET=1``) without its per-call re-patching, for the CPU tests.

A kernel launch under the interpreter patches ``triton.language`` once for the launch; every call of a
``@triton.jit`` helper inside the kernel then patches the same modules again (``inspect.getmembers`` over
``tl``, ``tl.tensor`` and ``tl.math``), which the launch's patch has already done, and never undoes it.
With helpers called per tile and per K step that is a third of the interpreted kernels' time.
:func:`skip_nested_patching` makes such a call reuse the launch's patch when the helper sees no language
module the launch has not patched; kernels compute exactly what they computed (every interpreter test
still checks its results). Triton versions without the private hook are left as they are.
"""

from __future__ import annotations

import inspect
from typing import Any


class _NoPatch:
    """The patch scope of a helper call that reused its launch's patch: nothing to undo."""

    def restore(self) -> None:
        pass


def skip_nested_patching() -> bool:
    """Install the faster patching into Triton's interpreter; False where this Triton has no such hook."""
    import triton.language as tl
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang", None)
    if original is None or getattr(original, "_autotaxer_fast", False):
        return original is not None
    launches: list[set[int]] = []  # the language modules patched by the launch in progress (innermost last)

    def langs(fn: Any) -> set[int]:
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}

    def patch_lang(fn: Any) -> Any:
        seen = langs(fn)
        if launches and seen <= launches[-1]:
            return _NoPatch()  # a helper inside a launch that patched these modules already
        scope = original(fn)
        if launches:  # a helper that sees another module: patched, kept until the launch ends (as before)
            launches[-1] |= seen
            return scope
        launches.append(seen)
        restore = scope.restore

        def restore_and_end() -> None:
            try:
                restore()
            finally:
                launches.pop()

        scope.restore = restore_and_end
        return scope

    patch_lang._autotaxer_fast = True  # type: ignore[attr-defined]
    interpreter._patch_lang = patch_lang
    return True


class InterpreterError(AssertionError):
    """A script failed in the interpreter worker (its traceback), or the worker died or timed out."""


class InterpreterWorker:
    """One ``TRITON_INTERPRET=1`` process that runs script after script (starting one costs seconds).

    ``run(script, argv=(), timeout=...)`` executes ``script`` in a fresh namespace of the worker, with
    ``sys.argv[1:] = argv``, and returns what it printed; a script that raises fails with its traceback
    (:class:`InterpreterError`), and the worker goes on. A worker that dies or outlives ``timeout`` is
    killed and started again for the next script. The worker skips the interpreter's nested re-patching
    (:func:`skip_nested_patching`).
    """

    def __init__(self) -> None:
        self._proc: Any = None
        self._stderr: Any = None  # a temporary file: what the worker wrote there, read if it dies

    def _start(self) -> None:
        import os
        import subprocess
        import sys
        import tempfile

        env = dict(os.environ, TRITON_INTERPRET="1")
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "autotaxer.testing.interpreter"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=env, text=True,
        )  # fmt: skip

    def run(self, script: str, argv: tuple[str, ...] = (), timeout: float = 240.0) -> str:
        """What ``script`` printed (collective with nothing: one process, ranks emulated inside)."""
        import json
        import select
        import time

        if self._proc is None or self._proc.poll() is not None:
            self._start()
        proc = self._proc
        proc.stdin.write(json.dumps({"script": script, "argv": list(argv)}) + "\n")
        proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, left))
            if ready:
                line = proc.stdout.readline()
                break
            if left <= 0:
                self.close(kill=True)
                raise InterpreterError(f"interpreter script did not finish within {timeout:.0f} s")
        if not line:  # the worker died (a crash in a kernel, say): its stderr says why
            code = proc.wait()
            self._stderr.seek(0)
            err = self._stderr.read()[-4000:]
            self.close(kill=True)
            raise InterpreterError(f"interpreter worker died (exit code {code}):\n{err}")
        reply = json.loads(line)
        if not reply["ok"]:
            raise InterpreterError(reply["stdout"][-2000:] + reply["error"])
        return reply["stdout"]

    def close(self, kill: bool = False) -> None:
        """End the worker: asked to leave (killed after 10 s), or ``kill``ed at once (a hung one)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if kill:
                proc.kill()
            proc.stdin.close()
            proc.wait(timeout=10)
        except Exception:  # a hung or dead worker: kill it
            proc.kill()
            proc.wait()
        proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> InterpreterWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve() -> None:
    """The worker's loop: one JSON request per line on stdin, one JSON reply per line on stdout."""
    import contextlib
    import io
    import json
    import os
    import sys
    import traceback

    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("the interpreter worker needs TRITON_INTERPRET=1")
    skip_nested_patching()
    replies = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        sys.argv = ["-c", *request["argv"]]
        printed = io.StringIO()
        ok, error = True, ""
        with contextlib.redirect_stdout(printed):
            try:
                exec(compile(request["script"], "<interpreter script>", "exec"), {"__name__": "__main__"})
            except BaseException:  # reported to the test, which fails with it
                ok, error = False, traceback.format_exc()
        replies.write(json.dumps({"ok": ok, "stdout": printed.getvalue(), "error": error}) + "\n")
        replies.flush()


if __name__ == "__main__":
    _serve()
