"""Real vLLM engines (the CPU build) with a tiny model made on the spot, and vllm-router in front
of them (``router.py``), for tests and the demo.

Pure Python, no Django and no torch in this process: the engine runs in its own environment
(``make vllm-env`` builds ``.venv-vllm``); ``model.py`` is run with that environment's Python.
"""
