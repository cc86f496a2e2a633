"""Offline: training DSpark drafters and AR drafts against a frozen target, the tiny reference models, simulated
greedy rounds."""
