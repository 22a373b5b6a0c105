"""Helpers of bench/real_ab.py (the A/B of speculation on real vLLM engines)."""
