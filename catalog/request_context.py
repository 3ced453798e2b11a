"""What a request brings to the catalog's operations, passed to each as a parameter: who acts
(named in the commit records) and, for a request that carries an Idempotency-Key, the key whose
answer the operation keeps in the transaction of the change it answers.

The REST layer makes one per request; the embedded catalog and the server's own work (maintenance
on its thread, say) use `ANONYMOUS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from isbre.catalog.records import now_us
from isbre.catalog.store import WriteView


class KeyAnsweredError(Exception):
    """The Idempotency-Key was answered meanwhile (by another process): the change is rolled back,
    and the request is answered with what the key already holds."""


@dataclass(frozen=True)
class Idempotency:
    """An Idempotency-Key, and the request it stands for (`fingerprint`: method, path, query and
    body hashed): a retry with the same key and another request is refused."""

    key: str
    fingerprint: str

    def keep(self, view: WriteView, answer: Any) -> None:
        """Keep `answer` (small, JSON-able) under the key, in the change's own transaction."""
        if view.idempotent_response(self.key) is not None:
            raise KeyAnsweredError(self.key)
        view.put_idempotent_response(
            self.key, {"fingerprint": self.fingerprint, "outcome": answer, "ts": now_us()}
        )


@dataclass(frozen=True)
class RequestContext:
    actor: str | None = None
    idempotency: Idempotency | None = None

    def unkeyed(self) -> RequestContext:
        """The same caller, for a further change of an operation whose first change answered the key."""
        return RequestContext(self.actor)


ANONYMOUS = RequestContext()
