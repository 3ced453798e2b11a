"""What a relay is configured with (`[[relays]]` in the TOML file): where it sends the commit log,
what part of it, and from where it starts."""

from __future__ import annotations

import base64
import binascii
import hashlib
from abc import abstractmethod
from typing import Annotated, Literal
from urllib.parse import urlsplit, urlunsplit

from isbre.catalog.records import RECORD_KINDS
from isbre.events.filters import EventFilter, parse_namespace, parse_table
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

# A relay's name keys its position in the store (`relay:<name>`), and labels its metrics.
RELAY_NAME = r"^[A-Za-z0-9_.-]+$"
# The prefix of a Standard Webhooks signing secret.
SECRET_PREFIX = "whsec_"
# A NATS subject token is any text but these (they separate tokens and match others).
_SUBJECT_SPECIALS = frozenset(". *>\t\r\n")


class RelayBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: str
    name: str | None = Field(
        None,
        pattern=RELAY_NAME,
        description="Keys the relay's position in the store; default: made from its kind and target, "
        "so a relay whose target changes starts afresh unless it keeps a name.",
    )
    start: Literal["now", "earliest"] = Field(
        "now",
        description="Where a relay without a position starts: after the last commit when the server "
        "starts, or at the oldest commit the log retains.",
    )
    namespaces: list[str] = Field(
        default_factory=list, description="Only these namespaces and what they hold (empty: every one)."
    )
    tables: list[str] = Field(default_factory=list, description="Only these tables or views (`ns.table`).")
    kinds: list[str] = Field(default_factory=list, description="Only these kinds of change (`table.commit`).")
    warehouses: list[str] = Field(default_factory=list, description="Only these warehouses' changes.")
    principal: str | None = Field(
        None, description="Publish only what this principal (of `auth.principals`) may read."
    )
    max_retry_seconds: float = Field(
        30.0, gt=0, description="The longest wait between two tries of a message that failed."
    )

    @field_validator("namespaces", "tables")
    @classmethod
    def _names(cls, values: list[str], info: ValidationInfo) -> list[str]:
        parse = parse_namespace if info.field_name == "namespaces" else parse_table
        for value in values:
            parse(value)
        return values

    @field_validator("kinds")
    @classmethod
    def _kinds(cls, values: list[str]) -> list[str]:
        unknown = sorted(set(values) - set(RECORD_KINDS))
        if unknown:
            raise ValueError(f"unknown kinds {unknown}: one of {', '.join(RECORD_KINDS)}")
        return values

    @abstractmethod
    def target(self) -> str:
        """Where it sends, as a person may read it: the URL without user or password."""

    def key(self) -> str:
        """Its name, or one made from what it sends where."""
        if self.name is not None:
            return self.name
        digest = hashlib.sha256(self.identity().encode()).hexdigest()[:12]
        return f"{self.kind}-{digest}"

    @abstractmethod
    def identity(self) -> str:
        """What the default name is made from: a relay sending elsewhere has a position of its own."""

    def filters(
        self, scopes: tuple[tuple[str, ...], ...], tags: dict[str, tuple[str | None, ...]]
    ) -> list[EventFilter]:
        """What a record must match: each filter that is set (namespaces, tables, kinds,
        warehouses), and the principal's `scopes`. `tags`: each warehouse's record tags."""
        wanted = [tag for name in self.warehouses for tag in tags[name]]
        found = [EventFilter.parse(None, self.tables, self.kinds, scopes, wanted)]
        if self.namespaces:
            # A namespace filter is a scope of its own: the record's names must be under one of them.
            found.append(EventFilter(scopes=tuple(parse_namespace(ns) for ns in self.namespaces)))
        return found


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


class NatsRelay(RelayBase):
    """To a NATS JetStream stream, one message per commit on `<subject>.<namespace>.<name>`."""

    kind: Literal["nats"]
    url: str = Field("nats://127.0.0.1:4222", description="The NATS server (user:password@ works).")
    subject: str = Field("isbre.commits", description="Messages go to <subject>.<namespace levels>.<name>.")
    stream: str = Field("ISBRE", description="The JetStream stream; created (file storage) if missing.")
    ack_timeout_seconds: float = Field(5.0, gt=0, description="How long a publish waits for its ack.")

    @field_validator("subject")
    @classmethod
    def _subject(cls, value: str) -> str:
        tokens = value.split(".")
        if not all(tokens) or any(set(token) & _SUBJECT_SPECIALS for token in tokens):
            raise ValueError(f"{value!r} is not a NATS subject (dot-separated tokens, no wildcards)")
        return value

    def target(self) -> str:
        return f"{_without_password(self.url)} {self.stream} {self.subject}.>"

    def identity(self) -> str:
        return f"{_without_password(self.url)}|{self.stream}|{self.subject}"


class WebhookRelay(RelayBase):
    """To an HTTP endpoint, one signed POST per commit (Standard Webhooks)."""

    kind: Literal["webhook"]
    url: str = Field(description="Where each message is POSTed.")
    secret: str = Field(description="The signing secret: whsec_ and base64 (Standard Webhooks).")
    timeout_seconds: float = Field(10.0, gt=0, description="How long one delivery may take.")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if urlsplit(value).scheme not in ("http", "https"):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: str) -> str:
        signing_key(value)
        return value

    def target(self) -> str:
        return _without_password(self.url)

    def identity(self) -> str:
        return _without_password(self.url)


def signing_key(secret: str) -> bytes:
    """The key a `whsec_<base64>` secret stands for."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"a webhook secret starts with {SECRET_PREFIX} (then base64)")
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"a webhook secret is {SECRET_PREFIX} then base64: {exc}") from exc
    if len(key) < 24:
        raise ValueError("a webhook secret's key is at least 24 bytes (Standard Webhooks)")
    return key


def subject_token(text: str) -> str:
    """A namespace level or a name as one NATS subject token: `%`, the separators and the
    wildcards written as %XX, so that every name has a token of its own."""
    return "".join(f"%{ord(c):02X}" if c in _SUBJECT_SPECIALS or c == "%" else c for c in text)


Relay = Annotated[NatsRelay | WebhookRelay, Field(discriminator="kind")]
