"""Serving the engine over HTTP: an OpenAI-compatible API (`app`), the thread that drives the engine's online
step loop (`driver`), the request and response bodies (`protocol`) and the chat template (`chat`)."""
