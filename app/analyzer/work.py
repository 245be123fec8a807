"""The analyzer's heavy work, on every core it may use: the diagnosis, the killers and the curve.

The three read the built trace and nothing of one another's: each is cut into tasks (the
diagnosis into the trace's independent parts, parts.py, where the cache is unlimited; the killers
into their groups' searches; the curve is one pass) and the tasks run in worker processes forked
from this one, which read the trace where it lies instead of a copy sent to them; only their
answers come back, pickled (the diagnoses as their tallies, tally.py). The costliest tasks go
first, so the last one to end is a short one.
With one job, the same tasks run here, one after the other (the parts too: PARTS_MOST).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from app.analyzer.diagnose import diagnose_part, diagnose_trace
from app.analyzer.groups import FoundKiller, KillerGroup, costliest, group_killers, killer_groups
from app.analyzer.parts import independent_parts
from app.analyzer.tally import Tally, tallied, tally
from app.analyzer.trace import Built
from app.domain.replay.curve import CapacityCurve
from app.domain.replay.curve import capacity_curve as one_pass_curve

# The diagnosis' independent parts: as many as the trace has, up to this. A part's history is
# smaller than the whole trace's, its tables kept in the CPU's caches more of the time: the bench
# trace's 8 templates took a quarter less CPU as 8 parts, one after the other, than as one
# history. More parts also even out the workers.
PARTS_MOST = 64
# Each worker touches the trace's objects, so holds its own copy of their pages (about 120 MB on
# the 36 M-token bench trace) while the reading and building before it stay on one core: past a
# few workers, memory grows and time hardly falls. `--jobs` asks for more.
DEFAULT_JOBS_MOST = 4


@dataclass(frozen=True, slots=True)
class Work:
    tally: Tally  # of every request's diagnosis
    killers: list[FoundKiller]
    curve: CapacityCurve | None  # None when not asked for


@dataclass(frozen=True, slots=True)
class _Diagnose:
    indices: tuple[int, ...] | None  # an independent part; None: the whole trace
    blocks: int | None  # per server; None: unlimited


@dataclass(frozen=True, slots=True)
class _Killers:
    key: KillerGroup
    indices: list[int]


@dataclass(frozen=True, slots=True)
class _Curve:
    pass


_Task = _Diagnose | _Killers | _Curve


def default_jobs() -> int:
    """The cores this process may run on (where the system says which; else all of them), at
    most DEFAULT_JOBS_MOST."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cores, DEFAULT_JOBS_MOST)


def do_work(built: Built, *, blocks: int | None, curve: bool, jobs: int) -> Work:
    """Diagnose the trace (`blocks` per server, None: unlimited), find its killers and, when
    `curve`, its capacity curve, with up to `jobs` processes."""
    tasks = _tasks(built, blocks=blocks, curve=curve)
    if jobs <= 1:
        answers = [_run(built, task) for task in tasks]
    else:
        fork = multiprocessing.get_context("fork")  # the workers inherit the trace, not a copy of it
        with ProcessPoolExecutor(jobs, mp_context=fork, initializer=_inherit, initargs=(built,)) as pool:
            answers = list(pool.map(_run_inherited, tasks))
    return _gathered(tasks, answers)


def _tasks(built: Built, *, blocks: int | None, curve: bool) -> list[_Task]:
    """The tasks, the costliest first: the curve (one pass, not to be cut), the diagnosis' parts
    (the largest first), the killers' searches (the largest first)."""
    tasks: list[_Task] = [_Curve()] if curve else []
    if blocks is None:
        parts = independent_parts(built.requests, PARTS_MOST)
        tasks.extend(_Diagnose(tuple(part), None) for part in parts)
    else:
        tasks.append(_Diagnose(None, blocks))
    searches = sorted(killer_groups(built), key=lambda group: -len(group[1]))
    tasks.extend(_Killers(key, indices) for key, indices in searches)
    return tasks


def _run(built: Built, task: _Task) -> Any:
    if isinstance(task, _Diagnose):
        if task.indices is None:
            return tally(built, None, diagnose_trace(built, blocks=task.blocks))
        return tally(built, task.indices, diagnose_part(built, task.indices))
    if isinstance(task, _Killers):
        return group_killers(built, task.key, task.indices)
    return one_pass_curve(built.requests, block_size=built.block_size)


def _gathered(tasks: Sequence[_Task], answers: Sequence[Any]) -> Work:
    tallies: list[Tally] = []
    killers: list[FoundKiller] = []
    found_curve = None
    for task, answer in zip(tasks, answers, strict=True):
        if isinstance(task, _Diagnose):
            tallies.append(answer)
        elif isinstance(task, _Killers):
            killers.extend(answer)
        else:
            found_curve = answer
    return Work(tallied(tallies), costliest(killers), found_curve)


# -- in a worker ---------------------------------------------------------------------------------

_inherited: Built | None = None  # the trace, as the worker's fork found it


def _inherit(built: Built) -> None:
    global _inherited  # a worker's one trace, set once as it starts
    _inherited = built


def _run_inherited(task: _Task) -> Any:
    assert _inherited is not None
    return _run(_inherited, task)
