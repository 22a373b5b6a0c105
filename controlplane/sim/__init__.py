"""Trace-driven discrete-event simulator of an LLM serving cluster (pure Python, no Django)."""
