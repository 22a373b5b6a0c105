"""The demo and test harness: everything that plays the world around the product.

Not part of the product apps (an import-linter contract forbids any of them to import it): the
``make demo`` launcher (``demo.py``, ``launch.py``), the virtual cluster that plays the
simulator's engines in real time for real agents (``virtual/``), the real vLLM CPU engines, their
request driver and the real-preset demo (``realvllm/``), and what the virtual cluster and the
driver share: one gateway client posting request records (``gateway.py``) and one lifecycle
scheduler announcing engines that join (``lifecycle.py``).
"""
