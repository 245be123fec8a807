"""`prefixscope analyze` with its per-request diagnosis answered at no cost: the bound of what any
speed-up of the diagnosis could win end to end (bench_analyze's "diagnosis free" side). Everything
else runs as it does (reading, building, the killers, the curve, the report); the report's causes
are empty, so it is a measurement, not a report.

    python -m bench.analyze_bound TRACE --block-size B --json
"""

import sys
from typing import Any

from app.analyzer import work
from app.analyzer.cli import main
from app.analyzer.diagnose import Diagnosed
from app.analyzer.tally import tally
from app.analyzer.trace import Built

_run = work._run


def _diagnosis_free(built: Built, task: Any) -> Any:
    if isinstance(task, work._Diagnose):
        return tally(built, (), Diagnosed([], [], []))  # no request diagnosed
    return _run(built, task)


if __name__ == "__main__":
    work._run = _diagnosis_free  # the forked workers inherit it
    main(["analyze", *sys.argv[1:]])
