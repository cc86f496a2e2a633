"""Deciding and checking what the target accepts: the sampling transform, lossless verification, the verify-length
schedulers and their SPS table, the gamma regulator, STS calibration."""
