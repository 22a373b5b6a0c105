"""Pure decision logic shared by the simulator, the benchmarks, the Celery tasks and the agent.

Nothing in this package imports Django.
"""
