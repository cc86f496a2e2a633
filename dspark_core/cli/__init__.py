"""The engine's commands (build-tiny, bench, generate, train-drafter, calibrate, models, train-ar-draft, serve) and
what only they use: the bench harness, its identity report, prompt files, acceptance records."""
