"""Replication jobs: receive (websocket, long-poll fallback), acknowledge, execute, report.

Delivery is idempotent by job id: a small journal (``jobs.journal``, one JSON line per final
result, replayed at start) answers a job id it has already finished with the recorded result
instead of running it again, for the newest ``JOURNAL_KEEP`` jobs finished within
``JOURNAL_KEEP_S`` (the file is compacted to those when it holds twice as many lines). A failed job that comes back with a higher ``attempt`` (the
control plane's retry) runs again; a succeeded one never does.

Every job ends by its deadline: the runner waits for the executor until then, and past it (or on
``job.cancel``, or when the agent stops) aborts the job (``Job.abort``: the executor's socket is
shut, its waits end) and reports it failed. Executors run in daemon threads, so one stuck in a
system call that ignores the abort cannot keep the agent from exiting when it is told to stop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import websockets

from nodeagent.blockstore import BlockStore
from nodeagent.retry import Backoff
from nodeagent.transfers.base import Executor, Job, JobError, TransferResult
from wire import protocol

log = logging.getLogger(__name__)
# Executors bound their own work by the deadline (the nccl group's timeout, the tcp sender's
# socket calls) and then report their own, more telling error; the runner aborts a job that is
# still running this long after its deadline.
ABORT_GRACE_S = 5.0
Send = Callable[[dict[str, Any]], Awaitable[None]]
# Finished jobs the journal answers again: a redelivery or a retry comes within the job's attempts
# (minutes); a job whose result was forgotten runs again.
JOURNAL_KEEP = 4096
JOURNAL_KEEP_S = 24 * 3600.0


class Journal:
    """Record of finished jobs, fsynced, read back at start; the newest ``JOURNAL_KEEP`` that
    finished within ``JOURNAL_KEEP_S`` are kept, in memory and (compacted) in the file."""

    def __init__(self, path: Path, keep: int = JOURNAL_KEEP, keep_s: float = JOURNAL_KEEP_S):
        self.path, self.keep, self.keep_s = path, keep, keep_s
        self.results: dict[str, dict[str, Any]] = {}  # job id -> result, oldest first
        self.finished: dict[str, float] = {}  # job id -> when its result was recorded
        self.lines = 0  # lines in the file
        if path.exists():
            for line in path.read_text().splitlines():
                self.lines += 1
                try:
                    rec = json.loads(line)
                    self._keep(rec["job_id"], rec, float(rec.pop("finished_at", time.time())))
                except (ValueError, KeyError, TypeError):
                    continue  # a torn last line from a crash: that job simply runs again
            self._prune()
            if self.lines > len(self.results):
                self._compact()

    def get(self, job_id: str) -> dict[str, Any] | None:
        return self.results.get(job_id)

    def record(self, result: dict[str, Any]) -> None:
        now = time.time()
        self._keep(result["job_id"], result, now)
        with open(self.path, "a") as f:
            f.write(json.dumps({**result, "finished_at": now}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.lines += 1
        self._prune()
        if self.lines > 2 * self.keep:
            self._compact()

    def _keep(self, job_id: str, rec: dict[str, Any], at: float) -> None:
        self.results.pop(job_id, None)  # a later result of the same job goes last
        self.results[job_id] = rec
        self.finished[job_id] = at

    def _prune(self) -> None:
        """Forget the oldest results past the count, then those older than the age."""
        cutoff = time.time() - self.keep_s
        for job_id in list(self.results):
            if len(self.results) <= self.keep and self.finished[job_id] >= cutoff:
                break
            del self.results[job_id]
            del self.finished[job_id]

    def _compact(self) -> None:
        """Rewrite the file with the kept results only (a new file renamed over the old one)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            for job_id, rec in self.results.items():
                f.write(json.dumps({**rec, "finished_at": self.finished[job_id]}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self.lines = len(self.results)


class JobRunner:
    """Executes job messages with the configured transports and block store."""

    def __init__(
        self,
        journal: Journal,
        store: BlockStore,
        transports: dict[str, Executor],
        metrics: Any = None,
        cut_report: Callable[[], int] | None = None,
    ):
        self.journal = journal
        # Spools a report of every KV event seen so far and returns its seq: called before a
        # target acknowledges a copy, so the control plane knows which reports can show it.
        self.cut_report = cut_report
        self.store = store
        self.transports = transports
        self.metrics = metrics
        self.running: dict[str, asyncio.Task[None]] = {}
        self.jobs: dict[str, Job] = {}  # the running jobs, to abort them
        self.stopping = False  # the agent is stopping: new assignments are left unacknowledged
        self.loop: asyncio.AbstractEventLoop | None = None
        self._send: Send | None = (
            None  # the latest channel's send, for events not tied to a message
        )

    def notify(self, msg: dict[str, Any]) -> None:
        """Send an event from another thread (an LMCache lease renewal's reading) on the latest
        job channel; dropped, with a log line, while no channel is up."""
        loop, send = self.loop, self._send
        if loop is None or send is None:
            log.info(
                "no job channel yet: %s for job %s not sent", msg.get("type"), msg.get("job_id")
            )
            return

        async def deliver() -> None:
            try:
                await send(msg)
            except Exception as exc:  # the channel closed meanwhile: the next renewal says it again
                log.info("%s for job %s not sent: %s", msg.get("type"), msg.get("job_id"), exc)

        asyncio.run_coroutine_threadsafe(deliver(), loop)

    async def handle(self, msg: dict[str, Any], send: Send) -> None:
        self._send = send
        kind = msg.get("type")
        if kind == protocol.MSG_JOB_ASSIGN:
            await self._assign(msg.get("job") or {}, send)
        elif kind == protocol.MSG_JOB_CANCEL:
            job_id = str(msg.get("job_id"))
            task = self.running.get(job_id)
            if task:
                task.cancel()  # reports it cancelled now; _run aborts the executor's work
        elif kind == protocol.MSG_ERROR:
            log.warning(
                "control plane could not apply job %s: %s", msg.get("job_id"), msg.get("detail")
            )
        else:
            log.warning("ignoring unknown message type %r", kind)

    async def _assign(self, raw: dict[str, Any], send: Send) -> None:
        if self.stopping:
            return  # not acknowledged: the control plane delivers it again (here after a restart)
        try:
            job = Job.from_message(raw)
        except JobError as exc:
            job_id = str(raw.get("id", ""))
            log.error("%s", exc)
            if job_id:
                await send(protocol.job_result(job_id, False, None, 0, str(exc)))
            return
        cut = None
        if self.cut_report is not None and job.role == protocol.ROLE_TARGET:
            cut = self.cut_report()
        await send(protocol.job_ack(job.id, cut))
        done = self.journal.get(job.id)
        if done and (
            done["state"] == protocol.JOB_SUCCEEDED or done.get("attempt", 1) >= job.attempt
        ):
            await send({k: v for k, v in done.items() if k != "attempt"})
            return
        if job.id in self.running:
            return  # a duplicate delivery of a job in progress
        self.running[job.id] = asyncio.create_task(self._run(job, send))

    async def _run(self, job: Job, send: Send) -> None:
        loop = asyncio.get_running_loop()

        # A job's events reach the control plane in the order they happened: each progress send
        # waits for the one before it, and the result waits for the last (a long-poll channel
        # posts each on its own request, which can overtake the one before).
        last: list[asyncio.Future[None]] = []

        async def send_after(prev: asyncio.Future[None] | None, n: int) -> None:
            if prev is not None:
                await asyncio.gather(prev, return_exceptions=True)
            await send(protocol.job_progress(job.id, n))

        def queue_progress(n: int) -> None:
            prev = last[-1] if last else None
            last[:] = [asyncio.ensure_future(send_after(prev, n))]

        def progress(n: int) -> None:
            loop.call_soon_threadsafe(queue_progress, n)

        self.jobs[job.id] = job
        finished: asyncio.Future[TransferResult] = loop.create_future()

        def work() -> None:
            try:
                result = self._execute(job, progress)
            except Exception as exc:  # a transport bug fails the job, not the agent
                log.exception("job %s crashed", job.id)
                result = TransferResult(False, error=f"internal error: {exc}")
            loop.call_soon_threadsafe(_settle, finished, result)

        threading.Thread(target=work, name=f"job-{job.id[:8]}", daemon=True).start()
        try:
            result = await asyncio.wait_for(
                asyncio.shield(finished), timeout=max(job.seconds_left(), 0) + ABORT_GRACE_S
            )
        except TimeoutError:
            job.abort()
            result = TransferResult(False, error="deadline passed before the job ended")
        except asyncio.CancelledError:
            job.abort()
            result = TransferResult(False, error=protocol.JOB_CANCELLED)
        finally:
            self.running.pop(job.id, None)
            self.jobs.pop(job.id, None)
        if last:  # the progress queued before the result is settled goes first
            await asyncio.gather(last[-1], return_exceptions=True)
        record = protocol.job_result(
            job.id, result.ok, result.checksum, result.bytes, result.error, result.extra
        )
        state = record["state"]
        self.journal.record({**record, "attempt": job.attempt})
        if self.metrics:
            self.metrics.jobs.labels(state).inc()
            self.metrics.transfers.labels(job.transport, job.role, state).inc()
            self.metrics.transfer_bytes.labels(job.transport, job.role).inc(result.bytes)
        await send(record)

    async def stop(self, budget_s: float) -> None:
        """Abort every running job and give their results ``budget_s`` to be recorded and sent;
        then cancel what is left (its journal line may be missing: the job runs again)."""
        self.stopping = True
        for job in list(self.jobs.values()):
            job.abort()
        tasks = list(self.running.values())
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=budget_s)
        for t in pending:
            t.cancel()
        if pending:
            log.warning("%d job(s) did not end within the stop budget", len(pending))
            await asyncio.wait(pending, timeout=1.0)

    def _execute(self, job: Job, progress: Any) -> TransferResult:
        transport = self.transports.get(job.transport)
        if transport is None:  # an evict too: what it would remove was placed by that transport
            return TransferResult(
                False,
                error=f"transport {job.transport!r} is not enabled on this agent (it runs "
                f"{', '.join(self.transports) or 'none'}): add it to transfer.transports, "
                "and set transfer.listen for tcp and nccl",
            )
        if job.action == protocol.ACTION_EVICT:
            if job.role != protocol.ROLE_TARGET:
                return TransferResult(True)
            evict = getattr(transport, "evict", None)  # not-vocabulary: the method's name
            if evict is not None:  # an executor that removes the copy from the engine's cache
                return evict(job)  # type: ignore[no-any-return]
            for k in job.keys:
                self.store.delete(k)
            return TransferResult(True)
        if job.role == protocol.ROLE_SOURCE:
            return transport.send(job, self.store, progress)
        return transport.receive(job, self.store, progress)


class JobChannel:
    """The websocket to the control plane, with long-poll as the fallback."""

    def __init__(
        self,
        base_url: str,
        token: Callable[[], str],
        runner: JobRunner,
        *,
        mode: str = "websocket",
        long_poll_wait_s: int = 25,
        backoff: Backoff | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.runner = runner
        self.mode = mode
        self.wait_s = long_poll_wait_s
        self.backoff = backoff or Backoff(0.5, 30.0)
        self.stop_event = asyncio.Event()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token()}"}

    async def run(self) -> None:
        while not self.stop_event.is_set():
            if not self.token():
                await asyncio.sleep(0.5)  # not enrolled yet
                continue
            try:
                if self.mode == "websocket":
                    await self._websocket()
                else:
                    await self._long_poll()
                self.backoff.reset()
            except (OSError, websockets.WebSocketException, httpx.HTTPError) as exc:
                if self.mode == "websocket" and _refused_upgrade(exc):
                    log.warning("job websocket refused (%s); using long-poll", exc)
                    self.mode = "long-poll"
                    continue
                delay = self.backoff.next_delay()
                log.info("job channel down (%s); retry in %.1fs", exc, delay)
                try:
                    await asyncio.wait_for(self.stop_event.wait(), delay)
                except TimeoutError:
                    pass

    async def _websocket(self) -> None:
        url = self.base_url.replace("http", "ws", 1) + "/ws/agent/"
        async with websockets.connect(
            url, additional_headers=self._headers(), max_size=protocol.SOCKET_MESSAGE_MAX_BYTES
        ) as ws:
            self.backoff.reset()
            lock = asyncio.Lock()

            async def send(msg: dict[str, Any]) -> None:
                async with lock:
                    await ws.send(json.dumps(msg))

            async for raw in ws:
                if self.stop_event.is_set():
                    return
                try:
                    msg = json.loads(raw)
                except ValueError:
                    continue
                await self.runner.handle(msg, send)

    async def _long_poll(self) -> None:
        async with httpx.AsyncClient(timeout=self.wait_s + 10) as client:

            async def send(msg: dict[str, Any]) -> None:
                await client.post(
                    f"{self.base_url}/api/agents/jobs/{msg['job_id']}/events/",
                    json=msg,
                    headers=self._headers(),
                )

            while not self.stop_event.is_set():
                resp = await client.get(
                    f"{self.base_url}/api/agents/jobs/",
                    params={"wait": self.wait_s},
                    headers=self._headers(),
                )
                resp.raise_for_status()
                self.backoff.reset()
                for msg in resp.json():
                    await self.runner.handle(msg, send)


def _settle(fut: asyncio.Future[TransferResult], result: TransferResult) -> None:
    if not fut.done():
        fut.set_result(result)


def _refused_upgrade(exc: Exception) -> bool:
    """The server does not speak websockets here (e.g. 404 on /ws/agent/): fall back."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return isinstance(exc, websockets.InvalidStatus) and status in (400, 404, 405, 426)
