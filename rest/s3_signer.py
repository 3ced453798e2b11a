"""The remote signer's allow-list: which S3 operations it signs, parsed from the request and judged as data.

A sign request (the REST signer protocol's method, URI, headers and optional
body) is parsed once into one `S3Request`: the operation it is (a row of
`OPERATIONS`), the bucket and every object key it touches. The signer judges
that parsed form (role, keys inside the table, the warehouse's own endpoint and
bucket) and signs a URI rebuilt from it, so the value that was judged is the
value that is sent. Everything that is not a row of the table is refused:
bucket sub-resources (`?policy`, `?acl`, `?lifecycle`, ...), unknown or repeated
query parameters, headers outside `HEADERS`, and copies from outside the table.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import quote, unquote, urlsplit
from xml.etree import ElementTree

from isbre.catalog.s3_options import S3Options
from isbre.rest.roles import Role

# Bounds checked before any other work: parsing and signing cost grows with what a request carries.
MAX_HEADERS = 64
MAX_HEADER_BYTES = 16 << 10
MAX_URI_BYTES = 8192
# DeleteObjects takes at most 1,000 keys of at most 1,024 bytes each.
MAX_DELETE_KEYS = 1000
MAX_BODY_BYTES = 2 << 20

Target = Literal["object", "bucket"]

# Query parameter values, as regular expressions matched whole.
BLANK = ""
NUMBER = r"[0-9]{1,10}"
TOKEN = r"[A-Za-z0-9._~+/=-]{1,1024}"
ANY_TEXT = r"[^\x00-\x1f\x7f]{0,1024}"


class SigningRefusedError(Exception):
    """The signer will not sign this request for this caller (403)."""


@dataclass(frozen=True)
class Operation:
    """One S3 operation the signer may sign: how it is recognised and who may ask for it."""

    name: str
    method: str
    target: Target
    role: Role  # reader or writer: no object operation needs more
    # Query parameters it must carry, and those it may carry: name -> the pattern of its value.
    required: Mapping[str, str] = field(default_factory=dict)
    optional: Mapping[str, str] = field(default_factory=dict)
    copies: bool = False  # carries x-amz-copy-source, which must lie inside the table too
    needs_body: bool = False  # signed only with the request body, whose keys must lie inside the table

    def allows(self, name: str, value: str) -> bool:
        pattern = self.required.get(name, self.optional.get(name))
        if pattern is None:
            return False
        if name == "x-id":  # what newer SDKs add: the operation's own name
            return value == self.name
        return re.fullmatch(pattern, value) is not None


_X_ID = {"x-id": ""}  # the pattern is the operation's name (Operation.allows)
_LISTING = {
    "delimiter": ANY_TEXT,
    "continuation-token": TOKEN,
    "max-keys": NUMBER,
    "start-after": ANY_TEXT,
    "fetch-owner": "true|false",
    "encoding-type": "url",
}
_UPLOAD = {"uploadId": TOKEN, "partNumber": NUMBER}

# The allow-list. A request is the one row whose method, target, query parameters and copy source it
# matches; readers get the reader rows, writers every row.
OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "GetObject", "GET", "object", "reader", optional={"versionId": TOKEN, "partNumber": NUMBER, **_X_ID}
    ),
    Operation("HeadObject", "HEAD", "object", "reader", optional={"versionId": TOKEN, "partNumber": NUMBER}),
    Operation("ListObjectsV2", "GET", "bucket", "reader", {"list-type": "2", "prefix": ANY_TEXT}, _LISTING),
    Operation("PutObject", "PUT", "object", "writer", optional=_X_ID),
    Operation("CopyObject", "PUT", "object", "writer", optional=_X_ID, copies=True),
    Operation("DeleteObject", "DELETE", "object", "writer", optional={"versionId": TOKEN, **_X_ID}),
    Operation("DeleteObjects", "POST", "bucket", "writer", {"delete": BLANK}, _X_ID, needs_body=True),
    Operation("CreateMultipartUpload", "POST", "object", "writer", {"uploads": BLANK}, _X_ID),
    Operation("UploadPart", "PUT", "object", "writer", _UPLOAD, _X_ID),
    Operation("UploadPartCopy", "PUT", "object", "writer", _UPLOAD, _X_ID, copies=True),
    Operation("CompleteMultipartUpload", "POST", "object", "writer", {"uploadId": TOKEN}, _X_ID),
    Operation("AbortMultipartUpload", "DELETE", "object", "writer", {"uploadId": TOKEN}, _X_ID),
    Operation(
        "ListParts",
        "GET",
        "object",
        "writer",
        {"uploadId": TOKEN},
        {"max-parts": NUMBER, "part-number-marker": NUMBER, **_X_ID},
    ),
)

# Headers a request may carry to be signed (lower case), and prefixes of such names. The signer makes
# the signature's own headers anew; a copy's headers come only with a copy.
HEADERS = frozenset(
    {
        "accept",
        "accept-encoding",
        "cache-control",
        "connection",
        "content-disposition",
        "content-encoding",
        "content-language",
        "content-length",
        "content-md5",
        "content-type",
        "expect",
        "expires",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-unmodified-since",
        "range",
        "transfer-encoding",
        "user-agent",
        "x-amz-checksum-mode",
        "x-amz-decoded-content-length",
        "x-amz-expected-bucket-owner",
        "x-amz-mp-parts-count",
        "x-amz-request-payer",
        "x-amz-sdk-checksum-algorithm",
        "x-amz-storage-class",
        "x-amz-trailer",
        "x-amz-write-offset-bytes",
    }
)
HEADER_PREFIXES = ("amz-sdk-", "x-amz-meta-", "x-amz-checksum-", "x-amz-server-side-encryption")
COPY_HEADERS = frozenset({"x-amz-copy-source-range", "x-amz-metadata-directive", "x-amz-tagging-directive"})
COPY_HEADER_PREFIXES = ("x-amz-copy-source-if-", "x-amz-source-expected-bucket-owner")
REMADE = frozenset({"authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256", "host"})
COPY_SOURCE = "x-amz-copy-source"


@dataclass(frozen=True)
class Endpoint:
    """Where a warehouse's bucket is reached: its scheme, host and port, and the bucket."""

    scheme: str
    hosts: tuple[str, ...]  # the service's host names (path-style); `<bucket>.<host>` is virtual-hosted
    port: int | None
    bucket: str

    @classmethod
    def of(cls, options: S3Options, bucket: str) -> Endpoint:
        if options.endpoint:
            parsed = urlsplit(options.endpoint)
            return cls(parsed.scheme, ((parsed.hostname or "").lower(),), parsed.port, bucket)
        region = options.region or "us-east-1"
        hosts = [f"s3.{region}.amazonaws.com", f"s3.dualstack.{region}.amazonaws.com"]
        if region == "us-east-1":
            hosts.append("s3.amazonaws.com")
        return cls("https", tuple(hosts), None, bucket)

    def authority(self, host: str) -> str:
        return host if self.port is None else f"{host}:{self.port}"


@dataclass(frozen=True)
class S3Request:
    """A sign request parsed into the one S3 operation it is."""

    operation: Operation
    method: str
    uri: str  # rebuilt from the parsed parts: what is signed, and what the client then sends
    bucket: str
    key: str  # the object's key; "" for a bucket operation
    headers: dict[str, str]
    keys: tuple[str, ...]  # every key it touches: the object, a copy's source, a listing's prefix, ...
    body: bytes | None = None

    @property
    def role(self) -> str:
        return self.operation.role


def _refuse(why: str) -> SigningRefusedError:
    return SigningRefusedError(f"Not signed: {why}")


def _bounded(headers: Mapping[str, list[str]], uri: str, body: str | None) -> None:
    values = sum(len(v) for v in headers.values())
    size = sum(len(name) + sum(len(x) for x in v) for name, v in headers.items())
    if len(headers) > MAX_HEADERS or values > MAX_HEADERS:
        raise _refuse(f"more than {MAX_HEADERS} headers (the signer's limit)")
    if size > MAX_HEADER_BYTES:
        raise _refuse(f"headers larger than {MAX_HEADER_BYTES} bytes (the signer's limit)")
    if len(uri) > MAX_URI_BYTES:
        raise _refuse(f"a URI longer than {MAX_URI_BYTES} bytes (the signer's limit)")
    if body is not None and len(body) > MAX_BODY_BYTES:
        raise _refuse(f"a body larger than {MAX_BODY_BYTES} bytes (the signer's limit)")


def _headers(raw: Mapping[str, list[str]], authority: str) -> dict[str, str]:
    """The request's headers by lower-case name, each once; those the signature makes are left out."""
    found: dict[str, str] = {}
    for name, values in raw.items():
        lower = name.lower()
        if lower in found or not values:
            raise _refuse(f"the header {name!r} is given twice or without a value")
        value = ", ".join(values)
        if lower == "host" and value.lower() != authority.lower():
            raise _refuse(f"a Host header ({value!r}) that is not the URI's host")
        if lower not in REMADE:
            found[lower] = value
    return found


def _check_header_names(headers: Mapping[str, str], operation: Operation) -> None:
    for name in headers:
        if name in HEADERS or name.startswith(HEADER_PREFIXES):
            continue
        if operation.copies and (name in COPY_HEADERS or name.startswith(COPY_HEADER_PREFIXES)):
            continue
        if name == COPY_SOURCE and operation.copies:
            continue
        raise _refuse(f"the header {name!r} is not one the signer signs for {operation.name}")


def _query(raw: str) -> list[tuple[str, str]]:
    """The query's parameters as S3 reads them: `&`-separated, percent-decoded, each name once."""
    if not raw:
        return []
    if "+" in raw:  # S3 and form decoding read a '+' differently: one spelling, %20 or %2B
        raise _refuse("a '+' in the query (write it as %20 or %2B)")
    found: list[tuple[str, str]] = []
    for part in raw.split("&"):
        name, _, value = part.partition("=")
        name, value = unquote(name, errors="strict"), unquote(value, errors="strict")
        if not name:
            raise _refuse("an empty query parameter")
        if any(name == seen for seen, _ in found):
            raise _refuse(f"the query parameter {name!r} twice")
        found.append((name, value))
    return found


def _key_segments_ok(key: str) -> bool:
    return not any(segment in (".", "..") for segment in key.split("/"))


def _target(endpoint: Endpoint, host: str, path: str) -> tuple[str, str, bool]:
    """(bucket, raw key, virtual-hosted) of a URI on the endpoint."""
    if host in endpoint.hosts:
        bucket, _, key = path.lstrip("/").partition("/")
        return bucket, key, False
    for service in endpoint.hosts:
        if host.endswith("." + service):
            return host[: -len(service) - 1], path.lstrip("/"), True
    raise _refuse(f"the host {host!r} is not the warehouse's endpoint ({', '.join(endpoint.hosts)})")


def _copy_source(value: str, bucket: str) -> str:
    """The key a copy reads from: `bucket/key` or `/bucket/key`, URL-encoded, in the same bucket."""
    source, _, version = value.partition("?")
    if version and not re.fullmatch(r"versionId=" + TOKEN, version):
        raise _refuse(f"a copy source with {version!r}")
    if "+" in source:
        raise _refuse("a '+' in the copy source (write it as %20 or %2B)")
    source_bucket, _, key = unquote(source, errors="strict").lstrip("/").partition("/")
    if source_bucket != bucket or not key:
        raise _refuse(f"a copy from outside the table's bucket ({value!r})")
    return key


def _deleted_keys(body: bytes, headers: Mapping[str, str]) -> tuple[str, ...]:
    md5 = headers.get("content-md5")
    if md5 is not None and md5 != base64.b64encode(hashlib.md5(body).digest()).decode():
        raise _refuse("a DeleteObjects body whose Content-MD5 does not match it")
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as exc:
        raise _refuse(f"a DeleteObjects body that is not XML ({exc})") from exc
    if root.tag.rsplit("}", 1)[-1] != "Delete":
        raise _refuse("a DeleteObjects body without its Delete element")
    keys = []
    for child in root:
        name = child.tag.rsplit("}", 1)[-1]
        if name == "Quiet":
            continue
        if name != "Object":
            raise _refuse(f"a DeleteObjects body with a {name} element")
        found = [part.text or "" for part in child if part.tag.rsplit("}", 1)[-1] == "Key"]
        if len(found) != 1:
            raise _refuse("a DeleteObjects object without exactly one Key")
        keys.append(found[0])
    if not keys or len(keys) > MAX_DELETE_KEYS:
        raise _refuse(f"a DeleteObjects body with {len(keys)} keys (1 to {MAX_DELETE_KEYS})")
    return tuple(keys)


def _rebuilt_uri(endpoint: Endpoint, virtual: bool, key: str, query: list[tuple[str, str]]) -> str:
    host = f"{endpoint.bucket}.{endpoint.hosts[0]}" if virtual else endpoint.hosts[0]
    path = "/" + quote(key, safe="/~") if virtual else "/" + quote(f"{endpoint.bucket}/{key}", safe="/~")
    if not virtual and not key:
        path = "/" + quote(endpoint.bucket, safe="")
    parts = [
        quote(name, safe="-_.~") + ("=" + quote(value, safe="-_.~") if value else "") for name, value in query
    ]
    return f"{endpoint.scheme}://{endpoint.authority(host)}{path}" + ("?" + "&".join(parts) if parts else "")


def parse(
    endpoint: Endpoint,
    method: str,
    uri: str,
    raw_headers: Mapping[str, list[str]],
    body: str | None = None,
) -> S3Request:
    """The one S3 operation a sign request is, on `endpoint`'s bucket; SigningRefusedError otherwise."""
    _bounded(raw_headers, uri, body)
    method = method.upper()
    try:
        parsed = urlsplit(uri)
        port = parsed.port
    except ValueError as exc:
        raise _refuse(f"a URI that does not parse ({exc})") from exc
    host = (parsed.hostname or "").lower()
    if parsed.scheme != endpoint.scheme or port != endpoint.port or parsed.username or parsed.password:
        raise _refuse(f"{uri[:200]!r} is not on the warehouse's endpoint")
    if parsed.fragment or "+" in parsed.path or "\\" in parsed.path:
        raise _refuse("a URI with a fragment, a '+' or a backslash in its path")
    bucket, raw_key, virtual = _target(endpoint, host, parsed.path)
    if bucket != endpoint.bucket:
        raise _refuse(f"the bucket {bucket!r}: only the table's bucket {endpoint.bucket!r} is signed for")
    try:
        key = unquote(raw_key, errors="strict")
        query = _query(parsed.query)
    except UnicodeDecodeError as exc:
        raise _refuse("percent-encoding that is not UTF-8") from exc
    if not _key_segments_ok(key):
        raise _refuse("a key with '.' or '..' segments")
    headers = _headers(raw_headers, parsed.netloc)
    target: Target = "object" if key else "bucket"
    params = dict(query)
    matches = [
        operation
        for operation in OPERATIONS
        if operation.method == method
        and operation.target == target
        and operation.copies == (COPY_SOURCE in headers)
        and set(operation.required) <= set(params)
        and all(operation.allows(name, value) for name, value in query)
    ]
    if len(matches) != 1:
        shown = "&".join(name for name, _ in query)
        raise _refuse(
            f"{method} on {'an object' if key else 'the bucket'}"
            + (f" with ?{shown}" if shown else "")
            + (" and a copy source" if COPY_SOURCE in headers else "")
            + " is not an operation the signer signs"
        )
    (operation,) = matches
    _check_header_names(headers, operation)
    keys: tuple[str, ...] = (key,) if key else ()
    data = None
    if operation.copies:
        keys += (_copy_source(headers[COPY_SOURCE], bucket),)
    if operation.name == "ListObjectsV2":
        keys = (params["prefix"],)
    if operation.needs_body:
        if body is None:
            raise _refuse(f"{operation.name} without the request's body (the sign request's `body`)")
        data = body.encode()
        keys = _deleted_keys(data, headers)
    elif body:
        raise _refuse(f"{operation.name} with a body: only DeleteObjects sends one to be judged")
    for each in keys:
        if not _key_segments_ok(each):
            raise _refuse("a key with '.' or '..' segments")
    rebuilt = _rebuilt_uri(endpoint, virtual, key, query)
    return S3Request(operation, method, rebuilt, bucket, key, headers, keys, data)


def inside_table(request: S3Request, table_key: str) -> bool:
    """Whether every key the request touches lies under the table's key prefix (`<table key>/`)."""
    root = table_key.rstrip("/") + "/"
    return all(key.startswith(root) for key in request.keys)
