"""daphne under cProfile, every thread: ``python bench/_profile_daphne.py OUT <daphne args>``.

The event loop (main thread) and each thread that runs sync views (asgiref's ``SyncToAsync``) get
their own profiler, enabled only while a view runs; on exit (SIGTERM) the event loop's profile is
written to OUT.loop.prof and the views' threads, merged, to OUT.views.prof (``python -m pstats``). cProfile times wall clock, so database and Redis waits
show in the views' cumulative times. Used by ``bench/ingest.py --profile``.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import threading

from asgiref.sync import SyncToAsync

_profiles: dict[int, cProfile.Profile] = {}
_original = SyncToAsync.thread_handler


def _thread_handler(self, loop, *args, **kwargs):
    tid = threading.get_ident()
    prof = _profiles.get(tid)
    if prof is None:
        prof = _profiles[tid] = cProfile.Profile()
    prof.enable()
    try:
        return _original(self, loop, *args, **kwargs)
    finally:
        prof.disable()


def main() -> None:
    out, sys.argv = sys.argv[1], ["daphne", *sys.argv[2:]]
    SyncToAsync.thread_handler = _thread_handler
    from daphne.cli import CommandLineInterface

    main_prof = cProfile.Profile()
    main_prof.enable()
    try:
        CommandLineInterface.entrypoint()
    finally:
        main_prof.disable()
        pstats.Stats(main_prof).dump_stats(f"{out}.loop.prof")
        views = list(_profiles.values())
        if views:
            stats = pstats.Stats(views[0])
            for prof in views[1:]:
                stats.add(prof)
            stats.dump_stats(f"{out}.views.prof")


if __name__ == "__main__":
    main()
