"""Answers from ASGI middleware (authentication, the request guard, the prefix check), which runs
outside FastAPI's error handlers: the same ErrorModel the routes answer with."""

from __future__ import annotations

import json

from starlette.types import Send


async def send_error(
    send: Send, status: int, error_type: str, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """An ErrorModel answer from ASGI middleware, which runs outside FastAPI's error handlers."""
    body = json.dumps({"error": {"message": message, "type": error_type, "code": status}}).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": body})
