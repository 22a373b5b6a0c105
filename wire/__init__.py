"""The wire between the node agent and the control plane: the message vocabulary and shapes
(``protocol``) and the canonical block hashing both sides key blocks by (``blockhash``).

Standard library only: the agent image ships this package beside ``nodeagent`` and nothing of
the control plane.
"""
