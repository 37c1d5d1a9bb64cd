"""The project's own promises: the README and docs, the benchmark harness, the seed converter."""
