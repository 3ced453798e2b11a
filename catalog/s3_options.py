"""How the server reaches an S3 or S3-compatible store: endpoint, region, credentials, and the
locations it accepts. Kept apart from the FileIO (`object_storage`) so that what only reads
settings imports neither PyArrow's filesystems nor boto3."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

# Spark's Hadoop schemes: other clients read them as other filesystems, so they are not accepted as
# aliases of s3 (see docs/storage.md).
HADOOP_SCHEMES = ("s3a", "s3n")


@dataclass(frozen=True)
class S3Options:
    """How to reach a bucket; None fields come from the standard AWS environment and config chain."""

    endpoint: str | None = None
    region: str | None = None
    path_style: bool = False
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None

    def resolved(self) -> S3Options:
        """The options with the endpoint and region taken from the environment where not given."""
        endpoint = (
            self.endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        )
        region = self.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        return S3Options(
            endpoint,
            region or "us-east-1",
            self.path_style,
            self.access_key_id,
            self.secret_access_key,
            self.session_token,
        )

    def client_arguments(self) -> dict[str, Any]:
        """Keyword arguments of `boto3.client` for this store (credentials only where configured)."""
        from botocore.config import Config

        arguments: dict[str, Any] = {
            "region_name": self.region,
            "config": Config(s3={"addressing_style": "path" if self.path_style else "auto"}),
        }
        if self.endpoint:
            arguments["endpoint_url"] = self.endpoint
        if self.access_key_id:
            arguments["aws_access_key_id"] = self.access_key_id
            arguments["aws_secret_access_key"] = self.secret_access_key
            arguments["aws_session_token"] = self.session_token
        return arguments

    def client_properties(self) -> dict[str, str]:
        """FileIO properties every client needs to reach the store, whatever its credentials."""
        properties = {"s3.region": self.region or "us-east-1"}
        if self.endpoint:
            properties["s3.endpoint"] = self.endpoint
        properties["s3.path-style-access"] = str(self.path_style).lower()
        return properties


def s3_object(location: str) -> tuple[str, str]:
    """(bucket, key) of an `s3://bucket/key` location."""
    parsed = urlparse(location)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"Not an s3://bucket/key location: {location!r}")
    return parsed.netloc, parsed.path.lstrip("/")
