"""Access delegation (X-Iceberg-Access-Delegation): what an engine gets to reach a table's objects.

`vended-credentials`: temporary STS credentials, a session of the configured
role whose inline policy reaches only the table's prefix (reads only, for a
caller that may only read). `remote-signing`: the table's config points the
engine at this server's signer, which signs a request only for an object
inside that table, and only a read for a reader. Both are decided on the
table the handler loaded and the caller's role; a mode that is off, or a
table that is not on object storage, gets no credentials, as the spec allows.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from isbre.catalog import CatalogService
from isbre.catalog.locations import normalized
from isbre.catalog.object_storage import ObjectStorageIO
from isbre.catalog.s3_options import S3Options, s3_object
from isbre.rest import s3_signer
from isbre.rest.models import SignRequest
from isbre.rest.s3_signer import SigningRefusedError
from isbre.rest.settings import DelegationSettings

log = logging.getLogger(__name__)

HEADER = "x-iceberg-access-delegation"
VENDED, SIGNING = "vended-credentials", "remote-signing"
READS = ("s3:GetObject", "s3:GetObjectVersion")
WRITES = ("s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts")
# Credentials are handed out again while they have at least this share of their lifetime left.
REUSE_SHARE = 0.5
MAX_CACHED = 4096


@dataclass(frozen=True)
class TableAccess:
    """A LoadTableResult's `config`, `storage-credentials` and `remote-signing-config`."""

    config: dict[str, str] = field(default_factory=dict)
    credentials: list[dict[str, Any]] = field(default_factory=list)
    remote_signing: dict[str, Any] | None = None


def wanted(header: str | None) -> set[str]:
    return {mode.strip().lower() for mode in (header or "").split(",") if mode.strip()}


def session_policy(location: str, write: bool) -> dict[str, Any]:
    """An IAM policy reaching only the objects under `location` (an s3:// table location)."""
    bucket, key = s3_object(location.rstrip("/"))
    objects = f"arn:aws:s3:::{bucket}/{key}/*"
    actions = [*READS, *WRITES] if write else list(READS)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": actions, "Resource": [objects]},
            {
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{bucket}",
                "Condition": {"StringLike": {"s3:prefix": [f"{key}/*"]}},
            },
            {"Effect": "Allow", "Action": "s3:GetBucketLocation", "Resource": f"arn:aws:s3:::{bucket}"},
        ],
    }


@dataclass
class Delegation:
    """One warehouse's delegation modes and the clients they need."""

    options: S3Options | None  # None: the warehouse is not on object storage
    settings: DelegationSettings
    _vended: dict[tuple[str, bool], tuple[float, dict[str, str]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _own: Any = None
    _sts_client: Any = None

    @classmethod
    def of(cls, service: CatalogService, settings: DelegationSettings) -> Delegation:
        options = service.core.io.options if isinstance(service.core.io, ObjectStorageIO) else None
        delegation = cls(options, settings)
        if options is not None and settings.vended_credentials and not settings.role_arn:
            log.warning(
                "warehouse %r: vended credentials are off: no delegation.role_arn is set "
                "(ISBRE_DELEGATION__ROLE_ARN, or role_arn under [delegation] in the TOML file)",
                service.name,
            )
        return delegation

    @property
    def vends(self) -> bool:
        return self.options is not None and self.settings.vended_credentials and bool(self.settings.role_arn)

    @property
    def signs(self) -> bool:
        return self.options is not None and self.settings.remote_signing

    def table_config(
        self, modes: set[str], location: str, write: bool, signer: tuple[str, str] | None
    ) -> TableAccess:
        """What a client gets for a table at `location`; `signer`: (server URL, the table's signer
        path) for remote signing."""
        if self.options is None or not location.startswith("s3://"):
            return TableAccess()
        # Where the bucket is (endpoint, path style, region) goes to every client: one with keys of
        # its own must not be sent to AWS's default endpoint.
        config = self.options.client_properties()
        if VENDED in modes and self.vends:
            credentials = {**config, **self.credentials(location, write)}
            return TableAccess(credentials, [{"prefix": location, "config": credentials}])
        if SIGNING in modes and self.signs and signer is not None:
            config |= {
                "s3.remote-signing-enabled": "true",
                "s3.signer": "S3V4RestSigner",
                # The spec's deprecated keys, for clients that do not read remote-signing-config; the
                # signer is at the spec's default path for the table, so that config holds nothing.
                "s3.signer.uri": signer[0],
                "s3.signer.endpoint": signer[1],
                "signer.uri": signer[0],
                "signer.endpoint": signer[1],
                # PyIceberg signs through its fsspec FileIO only.
                "py-io-impl": "pyiceberg.io.fsspec.FsspecFileIO",
            }
            return TableAccess(config, [], {"properties": {}, "headers": {}})
        return TableAccess(config)

    def credentials(self, location: str, write: bool) -> dict[str, str]:
        """Temporary credentials for the table at `location`, reused while fresh enough."""
        key = (normalized(location), write)
        now = time.time()
        with self._lock:
            cached = self._vended.get(key)
        lifetime = self.settings.credential_seconds
        if cached is not None and cached[0] - now > lifetime * REUSE_SHARE:
            return cached[1]
        answer = self._sts().assume_role(
            RoleArn=self.settings.role_arn,
            RoleSessionName="isbre-" + ("write" if write else "read"),
            Policy=json.dumps(session_policy(location, write)),
            DurationSeconds=lifetime,
        )["Credentials"]
        expires = answer["Expiration"].timestamp()
        found = {
            "s3.access-key-id": answer["AccessKeyId"],
            "s3.secret-access-key": answer["SecretAccessKey"],
            "s3.session-token": answer["SessionToken"],
            "s3.session-token-expires-at-ms": str(int(expires * 1000)),
        }
        with self._lock:
            if len(self._vended) >= MAX_CACHED:
                self._vended.clear()
            self._vended[key] = (expires, found)
        return found

    def _sts(self) -> Any:
        """One STS client, made once (clients are safe to share across threads; making sessions
        on many threads at once is not)."""
        import boto3

        assert self.options is not None
        with self._lock:
            if self._sts_client is None:
                arguments = self.options.client_arguments()
                arguments.pop("config")
                endpoint = self.settings.sts_endpoint or self.options.endpoint
                if endpoint:
                    arguments["endpoint_url"] = endpoint
                self._sts_client = boto3.session.Session().client("sts", **arguments)
            return self._sts_client

    def sign(self, location: str, write_allowed: bool, request: SignRequest) -> dict[str, Any]:
        """Sign an S3 request (the REST signer protocol's body) if it is an operation of the
        allow-list (rest/s3_signer.py) that stays inside the table at `location`."""
        if not self.signs or not location.startswith("s3://"):
            raise ValueError(
                "Remote signing is off for this table: it is not on object storage, "
                "or its warehouse does not sign"
            )
        if request.provider not in (None, "s3"):
            raise ValueError(f"This signer signs S3 requests only, not provider {request.provider!r}")
        assert self.options is not None
        bucket, table_key = s3_object(normalized(location))
        endpoint = s3_signer.Endpoint.of(self.options, bucket)
        parsed = s3_signer.parse(endpoint, request.method, request.uri, request.headers, request.body)
        if parsed.role == "writer" and not write_allowed:
            raise SigningRefusedError(f"A reader may not sign {parsed.operation.name}")
        if not s3_signer.inside_table(parsed, table_key):
            raise SigningRefusedError(
                f"Not signed: {parsed.operation.name} reaches outside the table's location {location}"
            )
        return self._signed(parsed)

    def _credentials(self) -> Any:
        """The server's own credentials, found once (botocore sessions are not safe to create on
        many threads at once); refreshing ones (an instance role) stay current."""
        import boto3

        assert self.options is not None
        with self._lock:
            if self._own is None:
                session = boto3.session.Session(
                    aws_access_key_id=self.options.access_key_id,
                    aws_secret_access_key=self.options.secret_access_key,
                    aws_session_token=self.options.session_token,
                )
                self._own = session.get_credentials()
            if self._own is None:
                raise RuntimeError("The server has no S3 credentials to sign with")
            return self._own.get_frozen_credentials()

    def _signed(self, parsed: s3_signer.S3Request) -> dict[str, Any]:
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.config import Config

        assert self.options is not None
        request = AWSRequest(method=parsed.method, url=parsed.uri, headers=parsed.headers, data=parsed.body)
        # The payload is signed only where the signer has judged it (DeleteObjects): the signature then
        # holds the client to that body. Other bodies never reach the signer.
        signed_payload = parsed.body is not None
        request.context["client_config"] = Config(s3={"payload_signing_enabled": signed_payload})
        S3SigV4Auth(self._credentials(), "s3", self.options.region).add_auth(request)
        return {"uri": parsed.uri, "headers": {name: [value] for name, value in request.headers.items()}}
