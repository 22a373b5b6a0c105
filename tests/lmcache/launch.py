"""Run an LMCache module with every address it registers on loopback.

LMCache registers each worker at ``lmcache.v1.rpc_utils.get_ip()``, the machine's outward
address, and the controller then connects to it. Tests keep every connection on 127.0.0.1, so
this patches that function before the module (and anything importing it by name) loads:

    .venv-lmcache/bin/python tests/lmcache/launch.py lmcache.v1.api_server --port ...

It runs inside the LMCache environment (``make lmcache-env``), not the project's.
"""

import runpy
import sys

import lmcache.v1.rpc_utils as rpc_utils

rpc_utils.get_ip = lambda: "127.0.0.1"

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: launch.py MODULE [ARGS...]")
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
