"""A real S3 endpoint on loopback for tests and benchmarks: moto in server mode (S3, STS and IAM).

Set-up (a user for the catalog server, a role for vended credentials, buckets)
runs before moto starts enforcing; from then on every request must be signed
with known credentials and allowed by the caller's IAM policies, as on AWS.
moto alone ignores STS session policies: tests/moto_server.py applies them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from isbre.catalog.s3_options import S3Options

from tests import reaper
from tests.http_client import http
from tests.server import free_port

ACCOUNT = "123456789012"
REGION = "us-east-1"
ALLOW_ALL_S3 = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": ["s3:*"], "Resource": "*"}],
}


@dataclass
class MotoS3:
    endpoint: str
    process: subprocess.Popen[bytes]
    access_key_id: str = ""
    secret_access_key: str = ""
    role_arn: str = ""

    @classmethod
    def start(cls, log: Path, buckets: tuple[str, ...] = ("lake",)) -> MotoS3:
        for _ in range(3):  # a free port can be taken by another process before moto binds it
            moto = cls._launch(log)
            if moto is not None:
                moto._set_up(buckets)
                return moto
        raise RuntimeError(f"moto did not start: see {log}")

    @classmethod
    def _launch(cls, log: Path) -> MotoS3 | None:
        port = free_port()
        root = Path(__file__).parent.parent
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.moto_server", "127.0.0.1", str(port)],
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
        )
        reaper.watch_process(process.pid)
        moto = cls(f"http://127.0.0.1:{port}", process)
        deadline = time.monotonic() + 30
        while process.poll() is None and time.monotonic() < deadline:
            try:
                http.get(f"{moto.endpoint}/moto-api/", timeout=1)
                return moto
            except httpx.TransportError:
                time.sleep(0.1)
        process.kill()
        process.wait()
        return None

    def _set_up(self, buckets: tuple[str, ...]) -> None:
        anyone = {"aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
        iam = self.client("iam", **anyone)
        iam.create_user(UserName="isbre")
        server_policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": ["s3:*", "sts:AssumeRole"], "Resource": "*"}],
        }
        iam.put_user_policy(UserName="isbre", PolicyName="catalog", PolicyDocument=json.dumps(server_policy))
        key = iam.create_access_key(UserName="isbre")["AccessKey"]
        self.access_key_id, self.secret_access_key = key["AccessKeyId"], key["SecretAccessKey"]
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:user/isbre"},
                    "Action": "sts:AssumeRole",
                }
            ],
        }
        role = iam.create_role(RoleName="engines", AssumeRolePolicyDocument=json.dumps(trust))
        self.role_arn = role["Role"]["Arn"]
        iam.put_role_policy(RoleName="engines", PolicyName="s3", PolicyDocument=json.dumps(ALLOW_ALL_S3))
        s3 = self.client("s3", **anyone)
        for bucket in buckets:
            s3.create_bucket(Bucket=bucket)
        # From here on moto authenticates and authorizes every request.
        http.post(f"{self.endpoint}/moto-api/reset-auth", content=b"0").raise_for_status()

    def client(self, service: str, **credentials: Any) -> Any:
        import boto3

        credentials = credentials or {
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
        }
        return boto3.session.Session().client(
            service, endpoint_url=self.endpoint, region_name=REGION, **credentials
        )

    def options(self) -> S3Options:
        """The server's credentials as storage options, path-style."""
        return S3Options(self.endpoint, REGION, True, self.access_key_id, self.secret_access_key)

    def server_env(self) -> dict[str, str]:
        """The environment of an isbre server using these as its own credentials (the AWS chain)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_REGION": REGION,
            "ISBRE_S3__PATH_STYLE": "true",
            "ISBRE_DELEGATION__ROLE_ARN": self.role_arn,
        }

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        pages = self.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
