"""Django backends the settings name: SQLite with queued writers, a Redis cache with one pool."""
