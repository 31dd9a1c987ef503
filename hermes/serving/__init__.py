"""Serving many viewers: stream settings, sources, live streams, the model worker, admission."""
