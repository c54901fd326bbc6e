"""pytest set-up for the binding's tests: `strata` comes from the build tree.

tools/test.sh runs them as `PYTHONPATH=build/release/python /usr/bin/python3 -m pytest
tests/python`; without PYTHONPATH the release build's folder is used when it exists."""
import os
import sys

_BUILD = os.path.join(os.path.dirname(__file__), "..", "..", "build", "release", "python")
if not any(os.path.isdir(os.path.join(p, "strata")) for p in sys.path if p):
    sys.path.insert(0, os.path.abspath(_BUILD))

# transformers and its PyPI-only dependencies, where tools/bootstrap.sh installed them (the
# Hugging Face test is skipped without them).
_PYDEPS = os.environ.get("STRATA_PYDEPS") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "strata", "pydeps")
if os.path.isdir(_PYDEPS) and _PYDEPS not in sys.path:
    sys.path.append(_PYDEPS)


def pytest_configure(config):
    # As CTest's label: `pytest -m "not slow"` leaves out the tests that take half a minute or
    # more (processes started and killed many times over).
    config.addinivalue_line("markers", "slow: a test that takes half a minute or more")
