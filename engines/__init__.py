"""Backends that run requests: vLLM and SGLang pools over HTTP, and the embedded engine."""
