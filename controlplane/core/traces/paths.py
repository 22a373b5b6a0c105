"""Where the shared real-trace folder lives: `$PREWARM_SHARED_DATA` or `<repo root>/../shared/data`."""

from __future__ import annotations

import os
from pathlib import Path

_REPO_ROOT = Path(__file__).resolve().parents[3]


def shared_data_dir() -> Path:
    """The shared data folder (CI clones the repo with `shared/` beside it)."""
    env = os.environ.get("PREWARM_SHARED_DATA")
    if env:
        return Path(env)
    return _REPO_ROOT.parent / "shared" / "data"
