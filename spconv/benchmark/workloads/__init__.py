"""Benchmark workloads. Each module exposes ``tasks(ctx) -> [Task]``; the CLI runs them under one progress bar."""
