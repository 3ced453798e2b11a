"""Several server processes on one port: `isbre serve --workers N`.

uvicorn's supervisor binds the port once and starts N worker processes that
accept on it, and replaces a worker that dies. Each worker opens the store and
runs its own writer thread; the store transactions of its table commits run on
the supervisor's writer, with every other worker's (catalog/shared_writer.py).
LMDB's write lock serializes the transactions, and `commit_seq` is assigned
inside them, so it stays one gapless sequence. The supervisor hands its
settings to the workers through the environment (they may hold secrets), with
one token-signing key for all of them, so that a token issued by one worker is
accepted by every other, and the key of its committer's socket.
"""

from __future__ import annotations

import os
import secrets

from fastapi import FastAPI
from isbre.catalog.forkserver import leave_the_forkserver
from isbre.catalog.processes import die_with_parent
from isbre.rest.connections import GuardedHttpProtocol
from isbre.rest.settings import Settings

SETTINGS_ENV = "ISBRE_WORKER_SETTINGS"


def hand_down(settings: Settings) -> Settings:
    """Put `settings` where the workers read them, with a token key they share."""
    if settings.auth.enabled and settings.auth.token_secret is None:
        auth = settings.auth.model_copy(update={"token_secret": secrets.token_urlsafe(32)})
        settings = settings.model_copy(update={"auth": auth})
    os.environ[SETTINGS_ENV] = settings.model_dump_json()
    return settings


def _handed_down() -> Settings:
    return Settings.model_validate_json(os.environ[SETTINGS_ENV])


class WorkerHttpProtocol(GuardedHttpProtocol):
    """The connection protocol of a worker: uvicorn imports it by name in each worker process, and
    `worker_app` sets its limits from the settings."""


def worker_app() -> FastAPI:
    """The app of one worker process (uvicorn calls this factory in each)."""
    from isbre.rest.app import create_app

    # Its parent is the server it was forked from, which ends with uvicorn's supervisor: a worker
    # the supervisor cannot watch any more ends too.
    leave_the_forkserver()
    die_with_parent()
    settings = _handed_down()
    WorkerHttpProtocol.max_header_bytes = settings.max_header_kb << 10
    WorkerHttpProtocol.header_timeout = settings.header_timeout_seconds
    return create_app(settings, worker=True)
