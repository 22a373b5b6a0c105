"""``prewarm-agent`` entry point: load the configuration, then run the agent until stopped."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys

from nodeagent.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = load_config(argv)
    except ConfigError as exc:
        print(f"prewarm-agent: configuration error: {exc}", file=sys.stderr)
        return 2
    if "--print-config" in (argv if argv is not None else sys.argv[1:]):
        redacted = dataclasses.asdict(cfg)
        if redacted["enrolment_token"]:
            redacted["enrolment_token"] = "***"
        print(json.dumps(redacted, indent=2))
        return 0
    logging.basicConfig(
        level=getattr(logging, cfg.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if logging.getLogger().level > logging.DEBUG:
        # httpx logs every request at INFO: a line per report, poll and progress event, forever.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    from nodeagent import memtrace, memtrim
    from nodeagent.agent import run_agent  # after config: keeps --help and errors light

    try:
        trim_every_s = memtrim.every_s_from_env(os.environ)
        mmap_threshold = memtrim.mmap_threshold_from_env(os.environ)
        memtrace.start_from_env(f"prewarm-agent {cfg.hostname}".replace(" ", "-"))
    except ValueError as exc:
        print(f"prewarm-agent: configuration error: {exc}", file=sys.stderr)
        return 2
    # The subscriber, tap, transfer and job threads each leave freed chunks in their own glibc
    # arena (an agent held 4-9 MB free beside 16-20 MB in use in the services demo): handed back
    # every PREWARM_MALLOC_TRIM_SECONDS, as the control plane's processes do.
    memtrim.start(trim_every_s, mmap_threshold=mmap_threshold)
    return run_agent(cfg)
