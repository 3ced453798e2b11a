"""What a request brings to the catalog's operations, in one object passed to each as a parameter:
who acts (named in the commit records), where they may put or read files, the Idempotency-Key
whose answer the change keeps in its own transaction, and the request's id (in the log lines a
commit writes).

The REST layer makes one per request (rest/wire.py `request_context`); the embedded catalog and
the server's own work (maintenance on its thread, say) use `ANONYMOUS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from isbre.catalog.locations import LocationPolicy
from isbre.catalog.records import now_us
from isbre.catalog.store import WriteView

T = TypeVar("T")


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
    # Where a caller scoped to some namespaces may put or read table and view files (under those
    # namespaces' locations); None: the catalog's own policy.
    places: LocationPolicy | None = None
    idempotency: Idempotency | None = None
    request_id: str | None = None

    def unkeyed(self) -> RequestContext:
        """The same caller, for a further change of an operation whose first change answered the key."""
        return dataclasses.replace(self, idempotency=None)

    def keyed(self, idempotency: Idempotency) -> RequestContext:
        return dataclasses.replace(self, idempotency=idempotency)

    def within(self, places: LocationPolicy | None) -> RequestContext:
        return dataclasses.replace(self, places=places)

    def answering(self, mutation: Callable[[Any], T], answer: Callable[[T], Any]) -> Callable[[Any], T]:
        """`mutation` (run on the writer with its batch), keeping `answer(result)` under the request's
        Idempotency-Key in the change's own transaction when it carries one: an attempt that lost a
        race and is staged again keeps it only when it commits."""
        idempotency = self.idempotency
        if idempotency is None:
            return mutation

        def answered(batch: Any) -> T:
            result = mutation(batch)
            idempotency.keep(batch.view, answer(result))
            return result

        return answered


ANONYMOUS = RequestContext()
