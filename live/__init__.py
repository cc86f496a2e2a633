"""A live deployment, ours, vLLM's or SGLang's: drive it with traffic (`loadgen`), watch its metrics
(`monitor`), store what it measured in the knowledge base and feed it back to `profile`."""
