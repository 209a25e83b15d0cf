"""Run the error catalogue's Before / After snippets as a reader would: pasted, with only the package.

``python tests/catalogue_examples.py`` reads ``{code: [before, after]}`` (JSON) on stdin and
prints ``{code: [outcome, outcome]}``: ``"ran"``, the code of the ``KvCanaryError`` a snippet
raised, or the other exception as text. Each Python snippet is compiled and executed in a fresh
namespace holding nothing but ``__name__``, in a fresh empty working directory: it has only its
own imports and arrays. A shell snippet (lines starting with ``kvcanary``) runs in ``bash``
there, ``kvcanary`` being this interpreter's ``python -m kvcanary_numba``. One process runs
them all (start-up once); ``tests/test_docs_catalogue.py`` starts it with nothing of the tests
on its path.

Warnings are errors, except the blind-spot advice every monitor built without the
expected-token check gives (the monitor examples keep it off for brevity). The address space
is capped at 32 GiB, so that an allocation meant to fail (KVC-C015) fails on a large machine too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import warnings

#: A snippet is a shell snippet when its first line is a ``kvcanary`` command.
SHELL = re.compile(r"^kvcanary\s")
_SHELL_PRELUDE = 'kvcanary() { "$KVCANARY_PYTHON" -m kvcanary_numba "$@"; }\n'


def is_shell(snippet: str) -> bool:
    return bool(SHELL.match(snippet.lstrip()))


def _shell(snippet: str, workdir: str) -> str:
    env = dict(os.environ, KVCANARY_PYTHON=sys.executable)
    proc = subprocess.run(
        ["bash", "-e", "-c", _SHELL_PRELUDE + snippet],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=workdir,
        env=env,
    )
    if proc.returncode == 0:
        return "ran"
    found = re.search(r"\[(KVC-[A-Z]\d{3})\]", proc.stderr)
    return found.group(1) if found else f"exit {proc.returncode}: {proc.stderr[-500:]}"


def _python(code: str, part: str, snippet: str) -> str:
    from kvcanary_numba.errors import KvCanaryError
    from kvcanary_numba.monitor import CanaryBlindSpotWarning

    namespace = {"__name__": "__main__"}
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):  # stdout: the report alone
        warnings.simplefilter("error")
        warnings.simplefilter("ignore", CanaryBlindSpotWarning)
        try:
            exec(compile(snippet, f"<{code} {part}>", "exec"), namespace)
        except KvCanaryError as exc:
            return exc.code
        except Exception as exc:  # noqa: BLE001 - reported, the test names it
            return f"{type(exc).__name__}: {exc}"
    return "ran"


def outcome(code: str, part: str, snippet: str) -> str:
    """Run one snippet in a fresh temporary working directory."""
    cwd = os.getcwd()
    workdir = tempfile.mkdtemp(prefix="kvc-example-")
    os.chdir(workdir)
    try:
        return _shell(snippet, workdir) if is_shell(snippet) else _python(code, part, snippet)
    finally:
        os.chdir(cwd)


def _limit_memory(gib: int = 32) -> None:
    try:
        import resource
    except ImportError:  # not POSIX
        return
    resource.setrlimit(resource.RLIMIT_AS, (gib << 30, resource.getrlimit(resource.RLIMIT_AS)[1]))


def run_all(snippets: dict[str, list[str]]) -> dict[str, list[str]]:
    _limit_memory()
    return {
        code: [outcome(code, part, text) for part, text in zip(("before", "after"), pair)]
        for code, pair in sorted(snippets.items())
    }


if __name__ == "__main__":
    # Nothing of the tests on the path: a snippet has the package and its own imports only.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]
    print(json.dumps(run_all(json.load(sys.stdin))))
