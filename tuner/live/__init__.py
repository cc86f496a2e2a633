"""Tuning against a live serving engine: each trial launches the engine with the tuned flags, drives the
profiled workload through it and reads what it measured (tune --engine vllm|sglang|dspark)."""
