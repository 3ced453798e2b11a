"""Commit events: the live broadcast, replay from the commit log, SSE and the pull endpoint, a client."""
