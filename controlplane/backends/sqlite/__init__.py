"""SQLite backend of the embedded default (``ENGINE = "controlplane.backends.sqlite"``)."""
