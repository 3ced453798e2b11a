"""Warehouses on S3 and S3-compatible stores: the server's own access to their objects.

The catalog reads metadata and manifests through PyIceberg's `PyArrowFileIO`
(configured with the warehouse's endpoint and credentials) and writes a
metadata file with a conditional create (`If-None-Match: *`), so that a commit
never overwrites an object, even one another server wrote meanwhile.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from isbre.catalog.s3_options import S3Options, s3_object
from pyiceberg.io.pyarrow import PyArrowFileIO


class ObjectExistsError(FileExistsError):
    """A conditional create found the object there already."""


class ObjectStorageIO(PyArrowFileIO):
    """PyIceberg's Arrow FileIO for reads and deletes, plus a create that never overwrites."""

    def __init__(self, options: S3Options) -> None:
        self.options = options.resolved()
        properties = self.options.client_properties()
        if self.options.access_key_id:
            properties["s3.access-key-id"] = self.options.access_key_id
            properties["s3.secret-access-key"] = self.options.secret_access_key or ""
            if self.options.session_token:
                properties["s3.session-token"] = self.options.session_token
        if self.options.path_style:
            properties["s3.force-virtual-addressing"] = "false"
        super().__init__(properties)

    @cached_property
    def client(self) -> Any:
        import boto3

        return boto3.session.Session().client("s3", **self.options.client_arguments())

    def create_exclusively(self, location: str, data: bytes) -> None:
        """Write a new object; ObjectExistsError if there is one (the store's PUT is durable when
        it answers)."""
        from botocore.exceptions import ClientError

        bucket, key = s3_object(location)
        try:
            self.client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in (
                "PreconditionFailed",
                "ConditionalRequestConflict",
            ):
                raise ObjectExistsError(f"{location} exists already") from exc
            raise

    def delete(self, location: str | Any) -> None:
        """Delete an object. Arrow's S3 filesystem recreates the parent "directory" marker after a
        delete, which would leave an object behind every removed file: S3 objects go through boto3."""
        path = location if isinstance(location, str) else location.location
        if not path.startswith("s3://"):
            super().delete(location)
            return
        self.delete_key(*s3_object(path))

    def delete_key(self, bucket: str, key: str) -> None:
        self.client.delete_object(Bucket=bucket, Key=key)

    def remove_empty_markers(self, location: str) -> None:
        """Delete the zero-byte "directory" objects (keys ending in /) some writers leave under
        `location`, each only if no other object lies under it: like removing empty directories."""
        bucket, root = s3_object(location.rstrip("/"))
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=root + "/")
        keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
        objects = [key for key in keys if not key.endswith("/")]
        for marker in (key for key in keys if key.endswith("/")):
            if not any(key.startswith(marker) for key in objects):
                self.client.delete_object(Bucket=bucket, Key=marker)
