"""What the end-to-end cluster's processes share: its database server, block size, the demo
password, the secret key and the queues its worker serves (every one)."""

import os

from controlplane.queues import Queue

PG_URL = os.environ.get("PREWARM_E2E_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")
BYTES_PER_BLOCK = 64 * 1024
PASSWORD = "e2e-pass-123456789"
SECRET = "e2e-only-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz"
QUEUES = ",".join(q.value for q in Queue)
