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
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote_plus

from isbre.rest.asgi_answers import send_error
from isbre.rest.roles import RANK
from isbre.rest.settings import AuthSettings, Principal
from starlette.types import ASGIApp, Receive, Scope, Send

PUBLIC = frozenset({"/v1/oauth/tokens", "/live", "/ready", "/health", "/metrics"})
# Public routes that say more to an admin: a token is verified when one comes, never required.
MORE_TO_ADMINS = frozenset({"/health"})


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
    expires_at: float | None = None  # when the token ends (None: a static token)

    def may_use(self, namespace: tuple[str, ...]) -> bool:
        if self.rank < 0:
            return False
        return not self.namespaces or any(namespace[: len(n)] == n for n in self.namespaces)


# Who calls a public route without credentials while authentication is on: below every role.
ANONYMOUS = Caller("anonymous", -1, ())


def _caller(principal: Principal, expires_at: float | None = None) -> Caller:
    return Caller(
        principal.name,
        max(RANK[role] for role in principal.roles),
        tuple(tuple(ns.split(".")) for ns in principal.namespaces),
        expires_at,
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
        if not isinstance(payload, dict):
            return None
        subject = payload.get("sub")
        principal = self._by_name.get(subject) if isinstance(subject, str) else None
        expires_at = payload.get("exp")
        if principal is None or not isinstance(expires_at, int) or expires_at < time.time():
            return None
        return _caller(principal, expires_at)


class AuthMiddleware:
    """Authentication only: who is calling. What they may do is decided by each route (rest/access.py)."""

    def __init__(
        self, app: ASGIApp, authenticator: Authenticator, public_prefixes: tuple[str, ...] = ()
    ) -> None:
        self.app = app
        self.authenticator = authenticator
        self.public_prefixes = public_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (
            scope["path"] in PUBLIC - MORE_TO_ADMINS or scope["path"].startswith(self.public_prefixes)
        ):
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization", b"").decode(errors="replace")
        token = header[7:] if header[:7].lower() == "bearer " else ""
        caller = self.authenticator.verify(token) if token else None
        if caller is None and scope["path"] in MORE_TO_ADMINS:
            await self.app(dict(scope, state={**scope.get("state", {}), "caller": ANONYMOUS}), receive, send)
            return
        if caller is None:
            message = (
                "Bad or expired credentials" if token else "Authentication required: send a bearer token"
            )
            challenge = [(b"www-authenticate", b'Bearer realm="isbre"')]
            await send_error(send, 401, "NotAuthorizedException", message, challenge)
            return
        # Routes act on what it may do (rest/access.py); its commits name it (rest/wire.py).
        scope = dict(scope, state={**scope.get("state", {}), "caller": caller})
        await self.app(scope, receive, send)


def _basic_credentials(authorization: str) -> tuple[str, str] | None:
    """Client id and secret from `Authorization: Basic`, each form-URL-encoded (RFC 6749, 2.3.1)."""
    if authorization[:6].lower() != "basic ":
        return None
    try:
        client_id, _, secret = base64.b64decode(authorization[6:]).decode().partition(":")
    except ValueError:
        return None
    return unquote_plus(client_id), unquote_plus(secret)


class FailureLimit:
    """Refuses a client id for a while after repeated wrong secrets: guessing costs time.

    Failures are counted per client id (known or not) in a window, in a small SQLite file in the
    server's state directory, so that every worker process of the server counts them together
    (a guesser gets no more tries by reaching another worker). The table is bounded: random ids
    cannot grow it without limit.
    """

    def __init__(self, failures: int, window_s: float, path: Path, tracked: int = 10_000) -> None:
        self._failures = failures
        self._window = window_s
        self._tracked = tracked
        self._path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connection() as db:
            db.execute("CREATE TABLE IF NOT EXISTS failures (client_id TEXT NOT NULL, at REAL NOT NULL)")
            db.execute("CREATE INDEX IF NOT EXISTS by_client ON failures (client_id, at)")

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self._path, timeout=10, isolation_level=None)
        try:
            yield db
        finally:
            db.close()

    def retry_after(self, client_id: str) -> int:
        """Seconds until `client_id` may try again; 0 when it may now."""
        now = time.time()
        with self._connection() as db:
            recent = [
                at
                for (at,) in db.execute(
                    "SELECT at FROM failures WHERE client_id = ? AND at > ? ORDER BY at DESC LIMIT ?",
                    (client_id, now - self._window, self._failures),
                )
            ]
        if len(recent) < self._failures:
            return 0
        return max(1, int(recent[-1] + self._window - now + 0.999))

    def failed(self, client_id: str) -> None:
        now = time.time()
        with self._connection() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute("DELETE FROM failures WHERE at <= ?", (now - self._window,))
            db.execute("INSERT INTO failures VALUES (?, ?)", (client_id, now))
            (count,) = db.execute("SELECT count(*) FROM failures").fetchone()
            if count > self._tracked * self._failures:  # the oldest go first
                db.execute(
                    "DELETE FROM failures WHERE rowid IN (SELECT rowid FROM failures ORDER BY at LIMIT ?)",
                    (count - self._tracked * self._failures,),
                )
            db.execute("COMMIT")


def token_response(
    authenticator: Authenticator, limit: FailureLimit, form: bytes, authorization: str
) -> tuple[int, dict[str, object], dict[str, str]]:
    """POST /v1/oauth/tokens: the OAuth2 client-credentials grant, answered as RFC 6749 says.

    Client credentials come in the form body (PyIceberg) or as HTTP Basic (DuckDB; RFC 6749's default).
    Returns the status, the body and extra headers.
    """
    fields = {key: values[0] for key, values in parse_qs(form.decode(errors="replace")).items()}
    if fields.get("grant_type") != "client_credentials":
        return (
            400,
            {"error": "unsupported_grant_type", "error_description": "only client_credentials is supported"},
            {},
        )
    client_id, secret = _basic_credentials(authorization) or (
        fields.get("client_id", ""),
        fields.get("client_secret", ""),
    )
    if wait := limit.retry_after(client_id):
        description = f"too many failed attempts for this client; retry in {wait} s"
        return 429, {"error": "slow_down", "error_description": description}, {"Retry-After": str(wait)}
    issued = authenticator.issue(client_id, secret)
    if issued is None:
        limit.failed(client_id)
        return 401, {"error": "invalid_client", "error_description": "unknown client or wrong secret"}, {}
    token, ttl = issued
    body = {
        "access_token": token,
        "token_type": "bearer",
        "expires_in": ttl,
        "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
    }
    return 200, body, {}
