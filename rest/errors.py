"""Every error leaves as the Iceberg REST spec's ErrorModel, with the code and type clients expect."""

from __future__ import annotations

import logging

import pydantic
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from isbre.catalog.consumers import ConsumerMovedError, NoSuchConsumerError
from isbre.catalog.job_process import JobProcessError
from isbre.catalog.limits import InsufficientStorageError, MetadataTooLargeError
from isbre.catalog.metadata_files import UnreadableMetadataError
from isbre.catalog.plans import ExpiredCommitsError
from isbre.catalog.purge import PurgeIncompleteError
from isbre.catalog.service import ConflictingPropertiesError
from isbre.catalog.store import (
    CommitStateUnknownError,
    StoreGrowthError,
    StoreUnavailableError,
)
from isbre.catalog.view_staging import InvalidViewVersionError
from isbre.catalog.writer import WriterClosedError, WriterOverloadedError
from isbre.events.subscription import CursorExpiredError
from isbre.rest.access import ForbiddenError
from isbre.rest.plan_work import PlansBusyError
from isbre.rest.s3_signer import SigningRefusedError
from isbre.rest.scan_json import NoSuchPlanIdError, NoSuchPlanTaskError
from isbre.rest.wire import BodyTooLargeError
from pyiceberg import exceptions as ice
from starlette.exceptions import HTTPException

log = logging.getLogger(__name__)

# Most specific first: a subclass must come before its base class.
_KNOWN: list[tuple[type[Exception], int, str]] = [
    (ForbiddenError, 403, "ForbiddenException"),
    (SigningRefusedError, 403, "ForbiddenException"),
    (ice.NoSuchNamespaceError, 404, "NoSuchNamespaceException"),
    (ice.NoSuchTableError, 404, "NoSuchTableException"),
    (ice.NoSuchViewError, 404, "NoSuchViewException"),
    (ice.NamespaceAlreadyExistsError, 409, "AlreadyExistsException"),
    (ice.TableAlreadyExistsError, 409, "AlreadyExistsException"),
    (ice.ViewAlreadyExistsError, 409, "AlreadyExistsException"),
    (ice.NamespaceNotEmptyError, 409, "NamespaceNotEmptyException"),
    (ice.CommitFailedException, 409, "CommitFailedException"),
    (ConflictingPropertiesError, 422, "UnprocessableEntityException"),
    (CursorExpiredError, 410, "CursorExpiredException"),
    (ExpiredCommitsError, 410, "CursorExpiredException"),
    (NoSuchPlanIdError, 404, "NoSuchPlanIdException"),
    (NoSuchConsumerError, 404, "NoSuchConsumerException"),
    (ConsumerMovedError, 409, "CommitFailedException"),
    (NoSuchPlanTaskError, 404, "NoSuchPlanTaskException"),
    (PlansBusyError, 503, "ServiceUnavailableException"),
    (WriterClosedError, 503, "ServiceUnavailableException"),
    (WriterOverloadedError, 503, "ServiceUnavailableException"),
    (StoreUnavailableError, 503, "ServiceUnavailableException"),
    # What the REST spec answers when a commit's state is unknown (clients must not retry blindly).
    (CommitStateUnknownError, 500, "CommitStateUnknownException"),
    (BodyTooLargeError, 413, "RequestEntityTooLargeException"),
    (MetadataTooLargeError, 413, "RequestEntityTooLargeException"),
    (InsufficientStorageError, 507, "InsufficientStorageException"),
    (StoreGrowthError, 507, "InsufficientStorageException"),
    (PurgeIncompleteError, 500, "PurgeIncompleteException"),
    (UnreadableMetadataError, 500, "UnreadableMetadataException"),
    (JobProcessError, 500, "MaintenanceJobFailedException"),
    (InvalidViewVersionError, 400, "IllegalArgumentException"),
    (ice.ValidationError, 400, "BadRequestException"),
    (pydantic.ValidationError, 400, "BadRequestException"),
    (RequestValidationError, 400, "BadRequestException"),
    (ValueError, 400, "BadRequestException"),
]

_HTTP_TYPES = {
    400: "BadRequestException",
    403: "ForbiddenException",
    404: "NotFoundException",
    405: "MethodNotAllowedException",
    406: "NotAcceptableException",
    415: "UnsupportedMediaTypeException",
}


def error_response(code: int, error_type: str, message: str) -> JSONResponse:
    # A 503 is temporary by definition here (overload, shutdown, the database down): say when to come
    # back; a full disk
    # takes longer to mend.
    headers = {"Retry-After": "1"} if code == 503 else {"Retry-After": "30"} if code == 507 else None
    return JSONResponse(
        {"error": {"message": message, "type": error_type, "code": code}}, status_code=code, headers=headers
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, pydantic.ValidationError | RequestValidationError):
        parts = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
            parts.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
        return "Invalid request: " + "; ".join(parts[:5])
    return str(exc) or type(exc).__name__


def classify(exc: BaseException) -> tuple[int, str]:
    for kind, code, error_type in _KNOWN:
        if isinstance(exc, kind):
            return code, error_type
    return 500, "InternalServerError"


def render_error(exc: BaseException) -> JSONResponse:
    code, error_type = classify(exc)
    if error_type == "InternalServerError":
        return error_response(500, error_type, f"Internal error: {type(exc).__name__}")
    return error_response(code, error_type, _describe(exc))


async def _handle(request: Request, exc: Exception) -> JSONResponse:
    code, error_type = classify(exc)
    if error_type == "InternalServerError":
        log.exception("unexpected error serving %s %s", request.method, request.url.path, exc_info=exc)
    elif code == 507:
        log.error("refused %s %s: %s", request.method, request.url.path, exc)
    return render_error(exc)


async def _handle_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)  # registered for it alone
    error_type = _HTTP_TYPES.get(exc.status_code, "RESTException")
    message = str(exc.detail)
    if exc.status_code == 404 and request.url.path.startswith("/v1/v1/"):
        # A client configured with ".../v1" as the catalog's URI adds its own /v1.
        root = str(request.base_url).rstrip("/")
        message = f"No route {request.url.path}: the catalog's URI is {root}, without /v1 (clients add it)"
    return error_response(exc.status_code, error_type, message)


def install(app: FastAPI) -> None:
    app.add_exception_handler(HTTPException, _handle_http)
    app.add_exception_handler(Exception, _handle)
    app.add_exception_handler(RequestValidationError, _handle)
    for kind, _, _ in _KNOWN:
        app.add_exception_handler(kind, _handle)
