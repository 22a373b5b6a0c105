"""Transfers of KV blocks between agents, behind one interface (``base.Transport``)."""
