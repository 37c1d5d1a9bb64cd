"""Unit tests: one module or rule at a time (options, probing, planning, splits, framing, storage)."""
