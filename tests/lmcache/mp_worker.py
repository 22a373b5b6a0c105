"""An inference engine's KV worker for real LMCache multiprocess servers, on CPU.

It runs inside the LMCache environment (``make lmcache-env``), not the project's:

    .venv-lmcache/bin/python tests/lmcache/mp_worker.py tcp://127.0.0.1:P1 tcp://127.0.0.1:P2

For each server it registers a CPU KV cache (``REGISTER_KV_CACHE`` over POSIX shared memory, the
path vLLM's LMCache adapter takes on a GPU with CUDA IPC), using LMCache's own client
(``lmcache bench server``'s), and keeps it registered until its stdin closes: a server answers
prefetches for a model only while a worker of that model is registered. Each stdin line is a
request, answered by one JSON line on stdout:

- ``{"server": i, "tokens": [...]}``: the engine computes these tokens' KV and the server stores
  it (whole 256-token chunks), as it does after a prefill -> ``{"ok": true}``.

The model is LMCache's bench model (``test-model``), world size 1. The first line written is
``{"ready": true}`` once every server accepted the registration.
"""

import json
import sys

from lmcache.cli.commands.bench.server_bench.client import RequestContext, ServerBenchClient
from lmcache.cli.commands.bench.server_bench.config import BenchConfig

SPEC = "(2,64,16,2,32):float16:2"  # 2 layers of (K/V, 64 blocks, 16 tokens, 2 heads, 32)
CHUNK, BLOCK = 256, 16


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def connect(rpc_url: str) -> ServerBenchClient:
    client = ServerBenchClient(
        BenchConfig(
            rpc_url=rpc_url,
            http_url="http://127.0.0.1:9",  # only its checksum API uses it: never called here
            mode="cpu",
            transfer_mode="lmcache_driven",
            tp_size=1,
            use_mla=False,
            num_tokens=CHUNK,
            kvcache_shape_spec=SPEC,
            num_blocks=64,
            block_size=BLOCK,
        ),
        log=log,
    )
    client.start()
    return client


def store(client: ServerBenchClient, tokens: list[int], n: int) -> dict:
    full = len(tokens) // CHUNK * CHUNK
    request = RequestContext(
        sequence_id=n,
        request_id=f"prewarm-test-{n}",
        request_kind="store",
        token_ids=tuple(tokens),
        num_full_tokens=full,
        total_chunks=full // CHUNK,
        chunk_size=CHUNK,
        block_offset=0,
        num_blocks=full // BLOCK,
    )
    result = client.store(request, 0, full)
    return {"ok": bool(result and result.succeeded), "tokens": full}


def main() -> None:
    clients = [connect(url) for url in sys.argv[1:]]
    print(json.dumps({"ready": True}), flush=True)
    try:
        for n, line in enumerate(sys.stdin):
            req = json.loads(line)
            try:
                out = store(clients[req["server"]], req["tokens"], n)
            except Exception as exc:  # the test reads the error
                out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(out), flush=True)
    finally:
        for client in clients:
            client.close()


if __name__ == "__main__":
    main()
