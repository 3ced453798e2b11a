"""`python -m tests.moto_server HOST PORT`: moto's S3/STS/IAM server, applying STS session policies.

On AWS, a session of an assumed role may do only what both the role's policies
and the session policy passed to AssumeRole allow, and a copy (CopyObject,
UploadPartCopy) also needs `s3:GetObject` on its source. moto evaluates the
role's policies only, ignores `Condition`s and never checks a copy's source;
this launcher adds the session policy to its check with its conditions (the
`s3:prefix` of a listing) and checks copy sources, so that the tests see a
vended credential refused outside its table, as AWS refuses it. It also checks
a body against its signed SHA-256 and its Content-MD5, as S3 does and moto does
not. It only ever refuses more than moto alone would.

Since moto 5.2.6 the action moto checks is the request's API operation
(`CreateMultipartUpload`, `HeadObject`, `ListObjectsV2`), where IAM names the
permission each operation needs (`s3:PutObject`, `s3:GetObject`, `s3:ListBucket`);
the launcher checks the permission, as AWS does, whichever moto it runs on.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import re
import sys
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from moto.iam import access_control
from moto.server import main
from moto.sts.models import sts_backends

_role_policies_allow = access_control.IAMRequestBase.check_action_permitted
_signature_matches = access_control.IAMRequestBase.check_signature
UNSIGNED = ("UNSIGNED-PAYLOAD", "STREAMING-UNSIGNED-PAYLOAD-TRAILER")
COPY_SOURCE = "x-amz-copy-source"

# The S3 operations whose permission has another name (AWS's "Amazon S3 API operations and their
# permissions"); every other operation's permission is its own name.
PERMISSION_OF = {
    "HeadObject": "GetObject",
    "CopyObject": "PutObject",
    "CreateMultipartUpload": "PutObject",
    "UploadPart": "PutObject",
    "UploadPartCopy": "PutObject",
    "CompleteMultipartUpload": "PutObject",
    "ListParts": "ListMultipartUploadParts",
    "DeleteObjects": "DeleteObject",
    "HeadBucket": "ListBucket",
    "ListObjects": "ListBucket",
    "ListObjectsV2": "ListBucket",
    "ListObjectVersions": "ListBucketVersions",
    "ListMultipartUploads": "ListBucketMultipartUploads",
}


def _session_policy(access_key_id: str) -> str | None:
    for account in sts_backends.values():
        for backend in account.values():
            for role in backend.assumed_roles:
                if role.access_key_id == access_key_id:
                    return role.policy
    return None


def _as_list(value: Any) -> list[str]:
    return value if isinstance(value, list) else [value]


def _like(pattern: str, value: str) -> bool:
    """IAM's wildcard match: `*` any run of characters, `?` one; nothing else is special."""
    expression = ".*".join(".".join(map(re.escape, part.split("?"))) for part in pattern.split("*"))
    return re.fullmatch(expression, value) is not None


def _condition_holds(operator: str, key: str, expected: list[str], context: dict[str, str]) -> bool:
    """One condition of a statement; an operator or key this evaluator does not know never holds."""
    if_exists = operator.endswith("IfExists")
    operator = operator.removesuffix("IfExists")
    if key not in context:
        return if_exists
    value = context[key]
    if operator == "StringEquals":
        return value in expected
    if operator == "StringNotEquals":
        return value not in expected
    if operator == "StringLike":
        return any(_like(pattern, value) for pattern in expected)
    if operator == "StringNotLike":
        return not any(_like(pattern, value) for pattern in expected)
    return False


def _statement_applies(
    statement: dict[str, Any], action: str, resource: str, context: dict[str, str]
) -> bool:
    actions = _as_list(statement.get("Action", []))
    if not any(fnmatch.fnmatchcase(action.lower(), pattern.lower()) for pattern in actions):
        return False
    if not any(_like(pattern, resource) for pattern in _as_list(statement.get("Resource", "*"))):
        return False
    for operator, keys in statement.get("Condition", {}).items():
        for key, expected in keys.items():
            if not _condition_holds(operator, key, _as_list(expected), context):
                return False
    return True


def session_policy_allows(policy: str, action: str, resource: str, context: dict[str, str]) -> bool:
    """Whether a session policy allows `action` on `resource`: an Allow that applies, no Deny."""
    statements = _as_list(json.loads(policy).get("Statement", []))
    applying = [s for s in statements if _statement_applies(s, action, resource, context)]
    return any(s["Effect"] == "Allow" for s in applying) and not any(s["Effect"] == "Deny" for s in applying)


def _context(path: str) -> dict[str, str]:
    """Condition keys of an S3 request: a listing's `s3:prefix`, `s3:delimiter`, `s3:max-keys`."""
    query = dict(parse_qsl(urlsplit(path).query, keep_blank_values=True))
    return {f"s3:{name}": query[name] for name in ("prefix", "delimiter", "max-keys") if name in query}


def _copy_source(headers: Any) -> str | None:
    """The object a copy reads, as an ARN."""
    value = headers.get(COPY_SOURCE) or headers.get(COPY_SOURCE.title())
    if not value:
        return None
    source = unquote(value.split("?", 1)[0]).lstrip("/")
    return f"arn:aws:s3:::{source}"


def _permission(action: str) -> str:
    service, _, operation = action.partition(":")
    return f"{service}:{PERMISSION_OF.get(operation, operation)}" if service == "s3" else action


def _check_action_permitted(self: Any, resource: str) -> None:
    self._action = _permission(self._action)
    _role_policies_allow(self, resource)
    source = _copy_source(self._headers) if self._action == "s3:PutObject" else None
    checks = [(self._action, resource)] + ([("s3:GetObject", source)] if source else [])
    if isinstance(self._access_key, access_control.AssumedRoleAccessKey):
        policy = _session_policy(self._access_key._access_key_id)
        if policy:
            context = _context(self._path)
            for action, arn in checks:
                if not session_policy_allows(policy, action, arn, context):
                    self._raise_access_denied()
    if source:  # the role's own policies, for the copy's source
        action, self._action = self._action, "s3:GetObject"
        try:
            _role_policies_allow(self, source)
        finally:
            self._action = action


def _check_signature(self: Any) -> None:
    """moto's signature check, plus S3's checks of the body against the signed payload hash and
    Content-MD5 (a signature over a body's hash holds only that body)."""
    _signature_matches(self)
    headers = {name.lower(): value for name, value in self._headers.items()}
    body = self._body if isinstance(self._body, bytes) else (self._body or "").encode()
    declared = headers.get("x-amz-content-sha256") or "UNSIGNED-PAYLOAD"
    hashed = declared not in UNSIGNED and not declared.startswith("STREAMING-")
    if hashed and declared != hashlib.sha256(body).hexdigest():
        self._raise_signature_does_not_match()
    md5 = headers.get("content-md5")
    if md5 and md5 != base64.b64encode(hashlib.md5(body).digest()).decode():
        self._raise_signature_does_not_match()


access_control.IAMRequestBase.check_action_permitted = _check_action_permitted  # type: ignore[method-assign]
access_control.IAMRequestBase.check_signature = _check_signature  # type: ignore[method-assign]

if __name__ == "__main__":
    main(["-H", sys.argv[1], "-p", sys.argv[2]])
