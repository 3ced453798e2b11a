"""Authentication and authorization: OAuth2 client credentials, static tokens, roles, namespace scopes.

Off by default (isbre binds to loopback). When on, every request but the token
endpoint and the probes needs `Authorization: Bearer <token>`: an access token
from `POST /v1/oauth/tokens` (what PyIceberg's `credential="id:secret"` gets)
or a principal's static token. Access tokens are HMAC-signed and expire;
secrets and static tokens are configured as SHA-256 hashes, never in clear.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, unquote_plus

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rest.settings import AuthSettings, Principal

PUBLIC = frozenset({"/v1/oauth/tokens", "/live", "/ready", "/health", "/metrics"})
RANK = {"reader": 0, "writer": 1, "admin": 2}


def sha256_hex(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Caller:
    name: str
    rank: int
    namespaces: tuple[tuple[str, ...], ...]  # empty: every namespace

    def may_use(self, namespace: tuple[str, ...]) -> bool:
        return not self.namespaces or any(namespace[: len(n)] == n for n in self.namespaces)


def _caller(principal: Principal) -> Caller:
    return Caller(
        principal.name,
        max(RANK[role] for role in principal.roles),
        tuple(tuple(ns.split(".")) for ns in principal.namespaces),
    )


class Authenticator:
    def __init__(self, settings: AuthSettings) -> None:
        self._key = (settings.token_secret or secrets.token_hex(32)).encode()
        self._ttl = settings.token_ttl_seconds
        self._clients = {p.client_id: p for p in settings.principals if p.client_id and p.secret_sha256}
        self._static = {p.token_sha256: p for p in settings.principals if p.token_sha256}
        self._by_name = {p.name: p for p in settings.principals}

    def issue(self, client_id: str, client_secret: str) -> tuple[str, int] | None:
        """An access token for valid client credentials, with its lifetime in seconds."""
        principal = self._clients.get(client_id)
        if principal is None or not hmac.compare_digest(
            principal.secret_sha256 or "", sha256_hex(client_secret)
        ):
            return None
        claims = _b64(json.dumps({"sub": principal.name, "exp": int(time.time()) + self._ttl}).encode())
        signature = _b64(hmac.new(self._key, claims.encode(), hashlib.sha256).digest())
        return f"{claims}.{signature}", self._ttl

    def verify(self, token: str) -> Caller | None:
        static = self._static.get(sha256_hex(token))
        if static is not None:
            return _caller(static)
        claims, _, signature = token.partition(".")
        expected = _b64(hmac.new(self._key, claims.encode(), hashlib.sha256).digest())
        if not signature or not hmac.compare_digest(signature, expected):
            return None
        try:
            payload = json.loads(_unb64(claims))
        except ValueError:
            return None
        principal = self._by_name.get(payload.get("sub"))
        if principal is None or payload.get("exp", 0) < time.time():
            return None
        return _caller(principal)


def required_rank(method: str, path: str, prefix: str) -> int:
    if method in ("GET", "HEAD"):
        return RANK["reader"]
    # Posts that change nothing: pulling events, and the scan reports clients send after reading.
    if method == "POST" and (path == f"/v1/{prefix}/events" or path.endswith("/metrics")):
        return RANK["reader"]
    catalog = f"/v1/{prefix}/namespaces"
    parts = path[len(catalog) :].strip("/").split("/") if path.startswith(catalog) else []
    namespace_level = path.startswith(catalog) and (len(parts) <= 1 or parts[1] == "properties")
    if method == "DELETE" or namespace_level:
        return RANK["admin"]  # drops, and creating or changing namespaces
    return RANK["writer"]


def _namespaces_in(path: str, query: bytes, body: bytes, prefix: str) -> list[tuple[str, ...]]:
    """Every namespace a request touches: from the path, a listing's parent, and bodies that name objects."""
    found = []
    catalog = f"/v1/{prefix}/namespaces/"
    if path.startswith(catalog):
        found.append(tuple(unquote(path[len(catalog) :].split("/")[0]).split("\x1f")))
    if path == catalog.rstrip("/") and (parent := parse_qs(query.decode(errors="replace")).get("parent")):
        found.append(tuple(parent[0].split("\x1f")))
    named_in_body = {f"/v1/{prefix}/{route}" for route in ("namespaces", "tables/rename", "views/rename")}
    if body and path in named_in_body | {f"/v1/{prefix}/transactions/commit"}:
        try:
            document = json.loads(body)
        except ValueError:
            return found  # the route will refuse the body itself
        if isinstance(document, dict):
            if isinstance(document.get("namespace"), list):
                found.append(tuple(map(str, document["namespace"])))
            for key in ("source", "destination"):
                if isinstance(document.get(key), dict) and isinstance(document[key].get("namespace"), list):
                    found.append(tuple(map(str, document[key]["namespace"])))
            for change in document.get("table-changes") or []:
                identifier = change.get("identifier") if isinstance(change, dict) else None
                if isinstance(identifier, dict) and isinstance(identifier.get("namespace"), list):
                    found.append(tuple(map(str, identifier["namespace"])))
    return found


def _problem(status: int, error_type: str, message: str, challenge: bool = False) -> Message:
    body = json.dumps({"error": {"message": message, "type": error_type, "code": status}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if challenge:
        headers.append((b"www-authenticate", b'Bearer realm="isbre"'))
    return {"status": status, "headers": headers, "body": body}


class AuthMiddleware:
    def __init__(self, app: ASGIApp, authenticator: Authenticator, prefix: str, max_body: int) -> None:
        self.app = app
        self.authenticator = authenticator
        self.prefix = prefix
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC:
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization", b"").decode()
        token = header[7:] if header[:7].lower() == "bearer " else ""
        caller = self.authenticator.verify(token) if token else None
        if caller is None:
            message = (
                "Bad or expired credentials" if token else "Authentication required: send a bearer token"
            )
            await _reply(send, _problem(401, "NotAuthorizedException", message, challenge=True))
            return
        if caller.rank < required_rank(scope["method"], scope["path"], self.prefix):
            await _reply(send, _problem(403, "ForbiddenException", f"{caller.name} may not do this"))
            return
        body, receive = await _buffered(receive, self.max_body)
        for namespace in _namespaces_in(scope["path"], scope.get("query_string", b""), body, self.prefix):
            if not caller.may_use(namespace):
                message = f"{caller.name} may not use namespace {'.'.join(namespace)}"
                await _reply(send, _problem(403, "ForbiddenException", message))
                return
        scope = dict(scope, state={**scope.get("state", {}), "caller": caller})
        await self.app(scope, receive, send)


async def _reply(send: Send, problem: Message) -> None:
    await send({"type": "http.response.start", "status": problem["status"], "headers": problem["headers"]})
    await send({"type": "http.response.body", "body": problem["body"]})


async def _buffered(receive: Receive, limit: int) -> tuple[bytes, Receive]:
    """Read the request body once (past `limit`, no further: the route answers 413), and hand the
    app a receive that replays what was read."""
    chunks, size, more = [], 0, True
    while more and size <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return b"", receive
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        more = message.get("more_body", False)
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return body, replay


def _basic_credentials(authorization: str) -> tuple[str, str] | None:
    """Client id and secret from `Authorization: Basic`, each form-URL-encoded (RFC 6749, 2.3.1)."""
    if authorization[:6].lower() != "basic ":
        return None
    try:
        client_id, _, secret = base64.b64decode(authorization[6:]).decode().partition(":")
    except ValueError:
        return None
    return unquote_plus(client_id), unquote_plus(secret)


def token_response(
    authenticator: Authenticator, form: bytes, authorization: str
) -> tuple[int, dict[str, object]]:
    """POST /v1/oauth/tokens: the OAuth2 client-credentials grant, answered as RFC 6749 says.

    Client credentials come in the form body (PyIceberg) or as HTTP Basic (DuckDB; RFC 6749's default).
    """
    fields = {key: values[0] for key, values in parse_qs(form.decode(errors="replace")).items()}
    if fields.get("grant_type") != "client_credentials":
        return 400, {
            "error": "unsupported_grant_type",
            "error_description": "only client_credentials is supported",
        }
    client_id, secret = _basic_credentials(authorization) or (
        fields.get("client_id", ""),
        fields.get("client_secret", ""),
    )
    issued = authenticator.issue(client_id, secret)
    if issued is None:
        return 401, {"error": "invalid_client", "error_description": "unknown client or wrong secret"}
    token, ttl = issued
    return 200, {
        "access_token": token,
        "token_type": "bearer",
        "expires_in": ttl,
        "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
    }
