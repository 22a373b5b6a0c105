"""The agent's Prometheus metrics (``prewarm_*``), on their own registry and HTTP endpoint."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class AgentMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.kv_block_events = Counter(
            "prewarm_agent_kv_block_events_total", "KV block events applied", ["engine"], registry=r
        )
        self.kv_gaps = Counter(
            "prewarm_agent_kv_sequence_gaps_total",
            "KV-event sequence gaps seen",
            ["engine"],
            registry=r,
        )
        self.kv_resyncs = Counter(
            "prewarm_agent_kv_resyncs_total",
            "Engine residency resyncs (gap not replayable, restart)",
            ["engine"],
            registry=r,
        )
        self.resident_blocks = Gauge(
            "prewarm_agent_resident_blocks", "Blocks resident per engine", ["engine"], registry=r
        )
        self.reports = Counter(
            "prewarm_agent_reports_total", "Reports by outcome", ["outcome"], registry=r
        )
        self.report_latency = Histogram(
            "prewarm_agent_report_latency_seconds",
            "Report POST round trip",
            registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.spool_reports = Gauge(
            "prewarm_agent_spool_reports", "Reports waiting in the spool", registry=r
        )
        self.spool_bytes = Gauge("prewarm_agent_spool_bytes", "Spool size on disk", registry=r)
        self.spool_dropped = Counter(
            "prewarm_agent_spool_dropped_reports_total",
            "Reports dropped at the spool bound",
            registry=r,
        )
        self.spool_corrupt = Counter(
            "prewarm_agent_spool_corrupt_reports_total",
            "Spooled reports skipped because the file was truncated or corrupt",
            registry=r,
        )
        self.gpus = Gauge("prewarm_agent_gpus", "GPUs readable in the last collection", registry=r)
        self.transfers = Counter(
            "prewarm_agent_transfers_total",
            "Transfers by transport, role and outcome",
            ["transport", "role", "outcome"],
            registry=r,
        )
        self.transfer_bytes = Counter(
            "prewarm_agent_transfer_bytes_total",
            "Bytes moved by transfers",
            ["transport", "role"],
            registry=r,
        )
        self.jobs = Counter(
            "prewarm_agent_jobs_total", "Replication jobs by final state", ["state"], registry=r
        )

        self.request_records = Counter(
            "prewarm_agent_request_records_total",
            "Request records from the taps by outcome (posted, refused, dropped)",
            ["outcome"],
            registry=r,
        )
        self.record_spool_batches = Gauge(
            "prewarm_agent_record_spool_batches",
            "Batches of request records waiting in the spool",
            registry=r,
        )

    def serve(self, listen: str) -> None:
        host, _, port = listen.rpartition(":")
        start_http_server(int(port), addr=host, registry=self.registry)
