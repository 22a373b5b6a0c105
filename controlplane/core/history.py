"""Past request history, read from files, as rows the demand store can take (pure; the import
service, ``controlplane/demand/history.py``, writes them).

Four formats (docs/api.md, "Request history"):

- ``jsonl``: one JSON object a line; ``csv``: a header line, then one request (or one count of
  requests) a line. Fields: ``time`` (unix seconds, or ISO 8601; no zone means UTC), ``tenant``,
  ``model``, ``prompt_tokens`` (the row's requests together), optional ``requests`` (how many
  requests the row stands for, default 1), ``seconds`` (spread them evenly over
  ``[time, time + seconds)``, default 0: all at ``time``), ``cached_tokens``, and the prefix as
  ``keys`` (hex canonical keys, root first), ``token_ids`` (with ``block_size``, ``lora_name``) or
  ``prefix_group`` (the workload key's hex group key). In CSV, ``keys`` and ``token_ids`` are
  space-separated.
- ``vllm-log``: vLLM's own log with ``--enable-log-requests``: the ``Received request`` lines of
  releases that log the prompt's token ids there, or the ``Request ... details`` lines newer
  releases write at debug level (``VLLM_LOGGING_LEVEL=DEBUG``). The time comes from the line's
  prefix (``MM-DD HH:MM:SS``, the server's local time, no year).
- ``vllm-router-log``: vllm-router's ``KV prefix decision`` lines (``--policy kv_aware``,
  ``--log-level debug``): time (UTC) and the prompt's tokens, no tenant and no prefix.

What a log does not carry (model, tenant, block size, year, zone) the caller gives as defaults.
A row that cannot be read raises ``HistoryError`` naming its line; nothing is guessed.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

from wire import blockhash

FORMATS = ("jsonl", "csv", "vllm-log", "vllm-router-log")
FIELDS = (
    "time",
    "tenant",
    "model",
    "prompt_tokens",
    "requests",
    "seconds",
    "cached_tokens",
    "keys",
    "token_ids",
    "block_size",
    "lora_name",
    "prefix_group",
)
MAX_REQUESTS_PER_ROW = 10**7
MAX_SECONDS_PER_ROW = 86400
MAX_TOKENS = 10**12
HEX = re.compile(r"^[0-9a-fA-F]{1,16}$")


class HistoryError(ValueError):
    """A line of the history that cannot be read (``line`` counts from 1)."""

    def __init__(self, line: int, detail: str):
        super().__init__(f"line {line}: {detail}")
        self.line = line
        self.detail = detail


@dataclass
class Defaults:
    """What the rows may leave out: given by whoever imports them."""

    model: str = ""
    tenant: str = ""  # empty: the model name (as the agent's request tap does by default)
    block_size: int = 16
    year: int | None = None  # vLLM's log prefix has none: the current year unless given
    utc_offset_minutes: int = 0  # vLLM's log prefix is the server's local time


@dataclass
class HistoryRow:
    """One line: ``requests`` requests of one tenant, model and prefix."""

    line: int
    time: float
    tenant: str
    model: str
    prompt_tokens: int
    requests: int = 1
    seconds: float = 0.0
    cached_tokens: int = 0
    chain: list[int] | None = None  # canonical keys of the prompt's blocks, root first
    block_size: int = 16
    prefix_group: str | None = None  # hex group key, when the row names it instead of a chain


def detect(first_line: str) -> str:
    """The format of a file from its first non-empty line."""
    s = ANSI.sub("", first_line).strip()
    if s.startswith("{"):
        return "jsonl"
    if VLLM_PREFIX.match(s) or VLLM_PREFIX.search(s[:40]) and s.startswith("("):
        return "vllm-log"
    if ROUTER_PREFIX.match(s):
        return "vllm-router-log"
    return "csv"


def read(lines: Iterable[str], fmt: str, defaults: Defaults) -> Iterator[HistoryRow]:
    """Rows of ``lines`` (text lines of one file) in ``fmt`` ("auto": from its first line)."""
    it = iter(lines)
    if fmt == "auto":
        first: list[str] = []
        for line in it:
            first.append(line)
            if line.strip():
                break
        fmt = detect(first[-1]) if first else "jsonl"
        it = _chain(first, it)
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    readers = {
        "jsonl": _jsonl,
        "csv": _csv,
        "vllm-log": _vllm_log,
        "vllm-router-log": _router_log,
    }
    yield from readers[fmt](it, defaults)


def _chain(first: list[str], rest: Iterator[str]) -> Iterator[str]:
    yield from first
    yield from rest


# -- documented formats ------------------------------------------------------------------------
def _jsonl(lines: Iterator[str], d: Defaults) -> Iterator[HistoryRow]:
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HistoryError(no, f"not JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise HistoryError(no, "not a JSON object")
        yield _row(no, obj, d)


def _csv(lines: Iterator[str], d: Defaults) -> Iterator[HistoryRow]:
    header: list[str] | None = None
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            cells = next(csv.reader(io.StringIO(line)))
        except (csv.Error, StopIteration) as exc:
            raise HistoryError(no, f"not a CSV line ({exc})") from None
        if header is None:
            header = [c.strip() for c in cells]
            unknown = [c for c in header if c not in FIELDS]
            if unknown or "time" not in header:
                raise HistoryError(
                    no,
                    f"the header names {', '.join(unknown) or 'no time column'}; "
                    f"columns are {', '.join(FIELDS)} (time required)",
                )
            continue
        if len(cells) != len(header):
            raise HistoryError(no, f"{len(cells)} cells, the header has {len(header)}")
        obj: dict[str, object] = {}
        for name, cell in zip(header, cells, strict=True):
            cell = cell.strip()
            if cell == "":
                continue
            obj[name] = cell.split() if name in ("keys", "token_ids") else cell
        yield _row(no, obj, d)


def _row(no: int, obj: dict, d: Defaults) -> HistoryRow:
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise HistoryError(no, f"unknown field {unknown[0]!r}; fields are {', '.join(FIELDS)}")
    if "time" not in obj:
        raise HistoryError(no, "no time")
    t = _time(no, obj["time"])
    model = _text(no, obj, "model") or d.model
    if not model:
        raise HistoryError(no, "no model (give it in the row, or as the import's model)")
    tenant = _text(no, obj, "tenant") or d.tenant or model
    block_size = _int(no, obj, "block_size", d.block_size, 1, 1 << 20)
    prefixes = [k for k in ("keys", "token_ids", "prefix_group") if k in obj]
    if len(prefixes) > 1:
        raise HistoryError(no, f"give one of keys, token_ids or prefix_group, not {prefixes}")
    chain: list[int] | None = None
    group = None
    if "keys" in obj:
        chain = [_hex(no, "keys", k) for k in _list(no, obj, "keys")]
    elif "token_ids" in obj:
        ids = [
            _int(no, {"token_ids": v}, "token_ids", 0, 0, 2**32 - 1)
            for v in _list(no, obj, "token_ids")
        ]
        chain = blockhash.chain_keys(
            ids, block_size, blockhash.extra_for(_text(no, obj, "lora_name") or None)
        )
    elif "prefix_group" in obj:
        group = str(obj["prefix_group"]).strip().lower()
        if group != "*":
            group = blockhash.to_hex(_hex(no, "prefix_group", group))
    requests = _int(no, obj, "requests", 1, 0, MAX_REQUESTS_PER_ROW)
    default_tokens = len(chain) * block_size * requests if chain else None
    if "prompt_tokens" not in obj and default_tokens is None:
        raise HistoryError(no, "no prompt_tokens (and no keys or token_ids to count them from)")
    prompt = _int(no, obj, "prompt_tokens", default_tokens or 0, 0, MAX_TOKENS)
    cached = _int(no, obj, "cached_tokens", 0, 0, MAX_TOKENS)
    if cached > prompt:
        raise HistoryError(no, f"cached_tokens {cached} > prompt_tokens {prompt}")
    seconds = _float(no, obj, "seconds", 0.0, 0.0, MAX_SECONDS_PER_ROW)
    return HistoryRow(
        no, t, tenant, model, prompt, requests, seconds, cached, chain, block_size, group
    )


def _time(no: int, value: object) -> float:
    if isinstance(value, bool):
        raise HistoryError(no, "time is not a time")
    if isinstance(value, int | float):
        t = float(value)
    else:
        s = str(value).strip()
        try:
            t = float(s)
        except ValueError:
            try:
                dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
            except ValueError:
                raise HistoryError(
                    no, f"time {s[:40]!r} is neither unix seconds nor ISO 8601"
                ) from None
            t = (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
    if not math.isfinite(t) or not 0 < t < 10**11:
        raise HistoryError(no, f"time {value!r} is not a plausible unix time")
    return t


def _text(no: int, obj: dict, name: str) -> str:
    v = obj.get(name)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise HistoryError(no, f"{name} is not text")
    v = v.strip()
    if len(v) > 200:
        raise HistoryError(no, f"{name} is longer than 200 characters")
    return v


def _list(no: int, obj: dict, name: str) -> list:
    v = obj[name]
    if not isinstance(v, list):
        raise HistoryError(no, f"{name} is not a list")
    if not v:
        raise HistoryError(no, f"{name} is empty")
    return v


def _hex(no: int, name: str, v: object) -> int:
    if not isinstance(v, str) or not HEX.match(v):
        raise HistoryError(no, f"{name}: {str(v)[:20]!r} is not a hex key of at most 16 digits")
    return int(v, 16)


def _int(no: int, obj: dict, name: str, default: int, lo: int, hi: int) -> int:
    v = obj.get(name)
    if v is None:
        return default
    try:
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
            raise ValueError
        n = int(v) if not isinstance(v, str) else int(v.strip())
    except (TypeError, ValueError):
        raise HistoryError(no, f"{name} {str(v)[:20]!r} is not a whole number") from None
    if not lo <= n <= hi:
        raise HistoryError(no, f"{name} {n} is outside {lo}..{hi}")
    return n


def _float(no: int, obj: dict, name: str, default: float, lo: float, hi: float) -> float:
    v = obj.get(name)
    if v is None:
        return default
    try:
        if isinstance(v, bool):
            raise ValueError
        x = float(v)
    except (TypeError, ValueError):
        raise HistoryError(no, f"{name} {str(v)[:20]!r} is not a number") from None
    if not (math.isfinite(x) and lo <= x <= hi):
        raise HistoryError(no, f"{name} {x} is outside {lo:g}..{hi:g}")
    return x


# -- engine and router logs --------------------------------------------------------------------
# vLLM's log prefix: "INFO 10-07 14:03:21 [logger.py:43] " (older: "... logger.py:43] "), with a
# "(APIServer pid=7) " in front in multi-process releases.
VLLM_PREFIX = re.compile(
    r"(?P<level>DEBUG|INFO|WARNING|ERROR)\s+(?P<md>\d\d-\d\d) (?P<hms>\d\d:\d\d:\d\d)(?:\.\d+)?\s"
)
VLLM_TOKENS = re.compile(r"prompt_token_ids: (?P<ids>\[[0-9, ]*\]|None)")
VLLM_LORA = re.compile(r"lora_name='(?P<name>[^']*)'")
VLLM_RECEIVED = re.compile(r"Received request (?P<id>\S+?): ")
VLLM_DETAILS = re.compile(r"Request (?P<id>\S+?) details: ")
# vllm-router (tracing, ChronoUtc "%Y-%m-%d %H:%M:%S"): the kv_aware policy's line per choice.
ROUTER_LINE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?)Z?\s+(?:DEBUG|INFO)\b.*?"
    r"KV prefix decision outcome=\"(?P<outcome>[^\"]*)\" worker=\"(?P<worker>[^\"]*)\" "
    r"input_tokens=(?P<input>\d+)"
)
ROUTER_PREFIX = re.compile(
    r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d\S*\s+(TRACE|DEBUG|INFO|WARN|ERROR)\b"
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _vllm_log(lines: Iterator[str], d: Defaults) -> Iterator[HistoryRow]:
    """One row per request with its prompt's token ids (the ``Received request`` line of
    releases that log them there, else the debug ``details`` line); lines of anything else are
    passed over. A request logged both ways counts once."""
    if not d.model:
        raise HistoryError(1, "a vLLM log names no model: give the import's model")
    year = d.year or datetime.now(UTC).year
    zone = timezone(timedelta(minutes=d.utc_offset_minutes))
    seen: set[str] = set()
    for no, raw in enumerate(lines, 1):
        line = ANSI.sub("", raw)
        m = VLLM_RECEIVED.search(line) or VLLM_DETAILS.search(line)
        if m is None:
            continue
        tok = VLLM_TOKENS.search(line, m.end())
        if tok is None or tok["ids"] == "None":
            continue  # this release logs no token ids on this line (or the prompt was embeds)
        if m["id"] in seen:
            continue
        seen.add(m["id"])
        pre = VLLM_PREFIX.search(line, 0, m.start())
        if pre is None:
            raise HistoryError(no, "no 'LEVEL MM-DD HH:MM:SS' prefix to take the time from")
        try:
            local = datetime.strptime(f"{year}-{pre['md']} {pre['hms']}", "%Y-%m-%d %H:%M:%S")
        except ValueError:
            raise HistoryError(no, f"{pre['md']} {pre['hms']} is not a date") from None
        try:
            ids = ast.literal_eval(tok["ids"])
        except (ValueError, SyntaxError):
            raise HistoryError(no, "prompt_token_ids is not a list of integers") from None
        if not ids:
            continue
        lora = VLLM_LORA.search(line, m.end())
        chain = blockhash.chain_keys(
            ids, d.block_size, blockhash.extra_for(lora["name"] if lora else None)
        )
        yield HistoryRow(
            no,
            local.replace(tzinfo=zone).timestamp(),
            d.tenant or d.model,
            d.model,
            len(ids),
            chain=chain,
            block_size=d.block_size,
            prefix_group=None if chain else "*",
        )


def _router_log(lines: Iterator[str], d: Defaults) -> Iterator[HistoryRow]:
    """One row per ``KV prefix decision`` line: its time and input tokens, under the import's
    model and tenant, in the tenant's catch-all group (the line names no prefix)."""
    if not d.model:
        raise HistoryError(1, "a vllm-router log names no model: give the import's model")
    for no, raw in enumerate(lines, 1):
        if "KV prefix decision" not in raw:
            continue
        m = ROUTER_LINE.search(ANSI.sub("", raw))
        if m is None:
            raise HistoryError(no, "a KV prefix decision line without its time or input_tokens")
        try:
            t = datetime.fromisoformat(m["ts"].replace(" ", "T")).replace(tzinfo=UTC)
        except ValueError:
            raise HistoryError(no, f"{m['ts']} is not a time") from None
        yield HistoryRow(
            no,
            t.timestamp(),
            d.tenant or d.model,
            d.model,
            int(m["input"]),
            block_size=d.block_size,
            prefix_group="*",
        )


def spread(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` whole numbers as evenly as possible (the extra ones evenly
    spaced), summing to ``total``."""
    base, rem = divmod(total, parts)
    return [base + ((i + 1) * rem // parts - i * rem // parts) for i in range(parts)]
