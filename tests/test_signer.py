"""The remote signer's allow-list, table-driven: every operation it signs, for a reader and a writer,
inside and outside the table, path-style and virtual-hosted; and what it refuses whatever the caller.

The judge is rest/s3_signer.py's `OPERATIONS`; `EXAMPLES` below holds one request of each, so an
operation added to the allow-list without an example here fails `test_every_operation_has_an_example`.
What the signer signs, a real S3 accepts: tests/test_object_storage.py sends signed requests to moto.
"""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass, field
from urllib.parse import quote

import pytest
from isbre.catalog.s3_options import S3Options
from isbre.rest.delegation import Delegation
from isbre.rest.models import SignRequest
from isbre.rest.s3_signer import OPERATIONS, SigningRefusedError
from isbre.rest.settings import DelegationSettings

ENDPOINT = "http://s3.test:9000"
TABLE = "s3://lake/wh/sales/t-0123"
INSIDE, OUTSIDE = "wh/sales/t-0123", "wh/other/u-4567"


@dataclass(frozen=True)
class Example:
    method: str
    query: str = ""  # after '?'; {key} is the table's (or the other table's) key prefix
    headers: dict[str, str] = field(default_factory=dict)
    bucket_level: bool = False
    body: str | None = None


def delete_body(prefix: str) -> str:
    return f'<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Object><Key>{prefix}/a.parquet</Key></Object></Delete>'


EXAMPLES: dict[str, Example] = {
    "GetObject": Example("GET", "x-id=GetObject"),
    "HeadObject": Example("HEAD"),
    "ListObjectsV2": Example("GET", "list-type=2&prefix={key}%2F&encoding-type=url", bucket_level=True),
    "PutObject": Example("PUT", headers={"x-amz-checksum-crc32": "AAAAAA==", "content-length": "7"}),
    "CopyObject": Example("PUT", headers={"x-amz-copy-source": "lake/{key}/source.parquet"}),
    "DeleteObject": Example("DELETE"),
    "DeleteObjects": Example("POST", "delete", bucket_level=True, body="{delete}"),
    "CreateMultipartUpload": Example("POST", "uploads"),
    "UploadPart": Example("PUT", "uploadId=u-1&partNumber=2"),
    "UploadPartCopy": Example(
        "PUT", "uploadId=u-1&partNumber=2", headers={"x-amz-copy-source": "/lake/{key}/source.parquet"}
    ),
    "CompleteMultipartUpload": Example("POST", "uploadId=u-1"),
    "AbortMultipartUpload": Example("DELETE", "uploadId=u-1"),
    "ListParts": Example("GET", "uploadId=u-1"),
}


@pytest.fixture(scope="module")
def delegation() -> Delegation:
    options = S3Options(ENDPOINT, "us-east-1", False, "AKIDEXAMPLE", "secret")
    return Delegation(options.resolved(), DelegationSettings(role_arn=None))


def sign_request(
    method: str, uri: str, headers: dict[str, str] | None = None, body: str | None = None
) -> SignRequest:
    return SignRequest.model_validate(
        {
            "method": method,
            "region": "us-east-1",
            "uri": uri,
            "headers": {name: [value] for name, value in (headers or {}).items()},
            "body": body,
        }
    )


def uri_of(example: Example, key_prefix: str, virtual: bool) -> str:
    if example.bucket_level:
        base = "http://lake.s3.test:9000/" if virtual else f"{ENDPOINT}/lake"
    else:
        path = f"{quote(key_prefix)}/data/x.parquet"
        base = f"http://lake.s3.test:9000/{path}" if virtual else f"{ENDPOINT}/lake/{path}"
    query = example.query.replace("{key}", quote(key_prefix, safe=""))
    return base + (f"?{query}" if query else "")


def request_of(example: Example, key_prefix: str, virtual: bool) -> SignRequest:
    headers = {name: value.replace("{key}", key_prefix) for name, value in example.headers.items()}
    body = delete_body(key_prefix) if example.body else None
    if body is not None:
        headers["content-md5"] = base64.b64encode(hashlib.md5(body.encode()).digest()).decode()
    return sign_request(example.method, uri_of(example, key_prefix, virtual), headers, body)


def test_every_operation_has_an_example() -> None:
    assert set(EXAMPLES) == {operation.name for operation in OPERATIONS}


CASES = [
    (operation, role, where, style)
    for operation in OPERATIONS
    for role in ("reader", "writer")
    for where in ("inside", "outside")
    for style in ("path-style", "virtual-host")
]


@pytest.mark.parametrize(
    ("operation", "role", "where", "style"), CASES, ids=["-".join((c[0].name, *c[1:])) for c in CASES]
)
def test_the_signer_signs_each_operation_only_for_its_roles_and_inside_the_table(
    delegation: Delegation, operation, role: str, where: str, style: str
) -> None:
    request = request_of(
        EXAMPLES[operation.name], INSIDE if where == "inside" else OUTSIDE, style == "virtual-host"
    )
    may = where == "inside" and (operation.role == "reader" or role == "writer")
    if not may:
        with pytest.raises(SigningRefusedError):
            delegation.sign(TABLE, role == "writer", request)
        return
    signed = delegation.sign(TABLE, role == "writer", request)
    headers = {name.lower(): values for name, values in signed["headers"].items()}
    assert headers["authorization"][0].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert signed["uri"].split("?")[0] == request.uri.split("?")[0]
    if operation.needs_body:  # the signature holds the client to the body that was judged
        assert request.body is not None
        expected = hashlib.sha256(request.body.encode()).hexdigest()
        assert headers["x-amz-content-sha256"] == [expected]
    else:
        assert headers["x-amz-content-sha256"] == ["UNSIGNED-PAYLOAD"]


def inside(path: str = "data/x.parquet") -> str:
    return f"{ENDPOINT}/lake/{INSIDE}/{path}"


BUCKET_SUB_RESOURCES = [
    "acl", "policy", "lifecycle", "cors", "website", "tagging", "versioning", "replication", "encryption",
    "notification", "logging", "ownershipControls", "publicAccessBlock", "object-lock", "uploads",
    "versions", "location", "accelerate", "requestPayment", "inventory", "analytics", "metrics",
    "intelligent-tiering", "policyStatus",
]  # fmt: skip


@pytest.mark.parametrize("method", ["GET", "PUT", "POST", "DELETE"])
@pytest.mark.parametrize("sub_resource", BUCKET_SUB_RESOURCES)
def test_no_bucket_sub_resource_is_signed(delegation: Delegation, method: str, sub_resource: str) -> None:
    for query in (
        sub_resource,
        f"{sub_resource}&prefix={quote(INSIDE)}%2F",
        f"prefix={quote(INSIDE)}%2F&{sub_resource}",
    ):
        with pytest.raises(SigningRefusedError):
            delegation.sign(TABLE, True, sign_request(method, f"{ENDPOINT}/lake?{query}"))


@pytest.mark.parametrize(
    ("method", "uri", "headers", "body"),
    [
        # A DeleteObjects "inside the table" by its prefix, whose body names another table's object.
        ("POST", f"{ENDPOINT}/lake?delete&prefix={quote(INSIDE)}%2F", {}, None),
        ("POST", f"{ENDPOINT}/lake?delete", {}, None),  # no body to judge
        ("POST", f"{ENDPOINT}/lake?delete", {}, delete_body(OUTSIDE)),
        ("POST", f"{ENDPOINT}/lake?delete", {"content-md5": "bm90IHRoZSBib2R5IG1kNQ=="}, delete_body(INSIDE)),
        ("POST", f"{ENDPOINT}/lake?delete", {}, "<Delete><Object><Key>a</Key><Key>b</Key></Object></Delete>"),
        ("POST", f"{ENDPOINT}/lake?delete", {}, "not xml"),
        # Copies from another table, another bucket, a key with '..'.
        ("PUT", inside(), {"x-amz-copy-source": f"lake/{OUTSIDE}/x.parquet"}, None),
        ("PUT", inside(), {"x-amz-copy-source": f"other/{INSIDE}/x.parquet"}, None),
        ("PUT", inside(), {"x-amz-copy-source": f"lake/{INSIDE}/../../other/u-4567/x"}, None),
        ("PUT", inside() + "?uploadId=u&partNumber=1", {"x-amz-copy-source": f"/lake/{OUTSIDE}/x"}, None),
        # Listings: two prefixes (S3 reads the first), a blank one, none, a sibling, the whole bucket.
        ("GET", f"{ENDPOINT}/lake?list-type=2&prefix=&prefix={quote(INSIDE)}%2F", {}, None),
        ("GET", f"{ENDPOINT}/lake?list-type=2&prefix&prefix={quote(INSIDE)}%2F", {}, None),
        ("GET", f"{ENDPOINT}/lake?list-type=2", {}, None),
        ("GET", f"{ENDPOINT}/lake?list-type=2&prefix={quote(INSIDE)}", {}, None),
        ("GET", f"{ENDPOINT}/lake?list-type=2&prefix=wh%2F", {}, None),
        ("GET", f"{ENDPOINT}/lake?prefix={quote(INSIDE)}%2F", {}, None),  # ListObjects v1
        ("GET", f"{ENDPOINT}/lake?list-type=2&prefix={quote(INSIDE)}%2F&unknown=1", {}, None),
        # Other hosts, buckets and endpoints.
        ("GET", f"http://other.s3.test:9000/{INSIDE}/x", {}, None),
        ("GET", f"http://s3.test:9000/other/{INSIDE}/x", {}, None),
        ("GET", f"https://s3.test:9000/lake/{INSIDE}/x", {}, None),
        ("GET", f"http://s3.test:9001/lake/{INSIDE}/x", {}, None),
        ("GET", f"http://evil.example/lake/{INSIDE}/x", {}, None),
        ("GET", f"http://user@s3.test:9000/lake/{INSIDE}/x", {}, None),
        ("GET", inside(), {"Host": "other.s3.test:9000"}, None),
        # Paths that leave the table.
        ("GET", f"{ENDPOINT}/lake/{INSIDE}/../u-4567/x", {}, None),
        ("GET", f"{ENDPOINT}/lake/{INSIDE}%2F..%2F..%2Fother/x", {}, None),
        ("GET", f"{ENDPOINT}/lake/{INSIDE}-sibling/x", {}, None),
        ("GET", f"{ENDPOINT}/lake/{INSIDE}/a+b", {}, None),
        # Headers that grant access or are not S3's.
        ("PUT", inside(), {"x-amz-acl": "public-read"}, None),
        ("PUT", inside(), {"x-amz-grant-read": "uri=http://acs.amazonaws.com/groups/global/AllUsers"}, None),
        ("PUT", inside(), {"x-amz-website-redirect-location": "/x"}, None),
        ("GET", inside(), {"x-amz-copy-source-range": "bytes=0-1"}, None),
        # Unknown methods and operations, a body where none is judged.
        ("PATCH", inside(), {}, None),
        ("OPTIONS", inside(), {}, None),
        ("GET", inside() + "?torrent", {}, None),
        ("GET", inside() + "?acl", {}, None),
        ("PUT", inside() + "?tagging", {}, None),
        ("PUT", inside(), {}, "a body"),
        ("GET", inside() + "?x-id=PutObject", {}, None),
        ("GET", inside() + "?versionId=1&versionId=2", {}, None),
    ],
)
def test_refused_whoever_asks(
    delegation: Delegation, method: str, uri: str, headers: dict[str, str], body: str | None
) -> None:
    with pytest.raises(SigningRefusedError):
        delegation.sign(TABLE, True, sign_request(method, uri, headers, body))


def test_the_signed_uri_is_rebuilt_from_what_was_judged(delegation: Delegation) -> None:
    signed = delegation.sign(TABLE, False, sign_request("GET", f"{ENDPOINT}/lake/{INSIDE}/a%20b%2Fc.parquet"))
    assert signed["uri"] == f"{ENDPOINT}/lake/{INSIDE}/a%20b/c.parquet"
    listing = delegation.sign(
        TABLE, False, sign_request("GET", f"{ENDPOINT}/lake?list-type=2&prefix={INSIDE}/")
    )
    assert listing["uri"] == f"{ENDPOINT}/lake?list-type=2&prefix={quote(INSIDE, safe='')}%2F"


def test_headers_are_bounded_before_any_signing_work(delegation: Delegation) -> None:
    many = {f"x-amz-meta-h{i}": "v" for i in range(20_000)}
    started = time.process_time()
    with pytest.raises(SigningRefusedError, match="more than 64 headers"):
        delegation.sign(TABLE, True, sign_request("PUT", inside(), many))
    with pytest.raises(SigningRefusedError, match="larger than 16384 bytes"):
        delegation.sign(TABLE, True, sign_request("PUT", inside(), {"x-amz-meta-big": "v" * 20_000}))
    assert time.process_time() - started < 1.0


def test_the_aws_endpoint_is_the_default() -> None:
    aws = Delegation(S3Options(None, "eu-west-1", False, "AKIDEXAMPLE", "secret"), DelegationSettings())
    for uri in (
        f"https://lake.s3.eu-west-1.amazonaws.com/{INSIDE}/x",
        f"https://s3.eu-west-1.amazonaws.com/lake/{INSIDE}/x",
    ):
        assert aws.sign(TABLE, False, sign_request("GET", uri))["uri"].startswith("https://")
    for uri in (
        f"https://lake.s3.us-east-1.amazonaws.com/{INSIDE}/x",
        f"https://lake.s3.eu-west-1.amazonaws.com.evil.example/{INSIDE}/x",
        f"http://lake.s3.eu-west-1.amazonaws.com/{INSIDE}/x",
    ):
        with pytest.raises(SigningRefusedError):
            aws.sign(TABLE, False, sign_request("GET", uri))
