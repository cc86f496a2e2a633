"""The target model and its weights: architecture, the lean runner with its slot KV cache, weight-only quantisation,
checkpoints, tokenizer, and fetching / converting a real checkpoint."""
