"""Runtime pieces: dispatch's hot path and what it serves from (tables, lookup, agreement, the runtimes
of each group)."""
