"""Prewarm node agent: GPU memory, vLLM KV-event residency, reporting and replication jobs.

Runs beside the inference engines on every GPU node. Depends only on the ``agent`` extra
(nvidia-ml-py, msgpack, pyzmq, httpx, websockets, prometheus-client), never on Django.
"""

__version__ = "0.1.0"
