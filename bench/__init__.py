"""llft's benchmarks: workloads that write JSON-lines records
(bench/SCHEMA.md) and a PySpark job that turns any number of such logs
into tables and plots.  `python -m bench --help`."""
import os
import sys
from pathlib import Path


def _installed_llft():
    """Imports the installed llft (scripts/setup.sh builds its native parts
    into it), not the source tree that `python -m bench` puts first on
    sys.path, which has no built extension: the benchmarks measure what
    llft-run runs."""
    root = os.path.realpath(Path(__file__).resolve().parents[1])
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != root]
    try:
        import llft  # noqa: F401
    except ImportError:
        pass
    finally:
        sys.path[:] = saved


_installed_llft()
