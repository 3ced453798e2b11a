"""The remote signer: how long an engine waits for one signature, beside signing the same request
itself with its own keys (botocore's SigV4, in process), measured in the same run.

The signer parses each request into one S3 operation of its allow-list, checks
its keys against the table, rebuilds the URI and signs it; the peer only signs.
The difference is what delegating the keys to isbre costs an engine per request.
"""

from __future__ import annotations

import statistics
import time
from functools import partial
from pathlib import Path

import httpx
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

from tests.bench.commits import SCHEMA_JSON
from tests.bench.harness import RUNS, Report, median_of
from tests.s3 import REGION, MotoS3
from tests.server import IsbreServer


def signer_latency_ms(client: httpx.Client, url: str, body: dict, requests: int) -> float:
    samples = []
    for _ in range(requests):
        start = time.perf_counter()
        client.post(url, json=body).raise_for_status()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def local_signing_ms(uri: str, requests: int) -> float:
    credentials = Credentials("AKIDEXAMPLE", "secret")
    samples = []
    for _ in range(requests):
        start = time.perf_counter()
        request = AWSRequest(method="GET", url=uri, headers={})
        request.context["client_config"] = Config(s3={"payload_signing_enabled": False})
        S3SigV4Auth(credentials, "s3", REGION).add_auth(request)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def run(workdir: Path, requests: int = 500) -> Report:
    report = Report(
        f"Remote signing: median milliseconds for one signature (median of {RUNS} runs of {requests}), "
        "isbre's signer over HTTP beside botocore signing in process",
        ["request", "isbre signer, ms", "botocore in process, ms", "isbre / in process"],
    )
    moto = MotoS3.start(workdir / "moto-signing.log", buckets=("lake",))
    (workdir / "signing-store").mkdir()
    server = IsbreServer(
        "s3://lake/signing", env=moto.server_env(), store=workdir / "signing-store" / "isbre.lmdb"
    )
    try:
        server.start()
        base = f"{server.url}/v1/isbre/namespaces"
        httpx.post(base, json={"namespace": ["bench"]}).raise_for_status()
        created = httpx.post(f"{base}/bench/tables", json={"name": "t", "schema": SCHEMA_JSON})
        location = created.raise_for_status().json()["metadata"]["location"]
        key = location.removeprefix("s3://lake/")
        cases = {
            "GetObject": f"{moto.endpoint}/lake/{key}/data/00000-0-x.parquet",
            "ListObjectsV2": f"{moto.endpoint}/lake?list-type=2&prefix={key}/data/",
        }
        with httpx.Client(timeout=30) as client:
            for name, uri in cases.items():
                body = {"method": "GET", "region": REGION, "uri": uri, "headers": {"User-Agent": ["bench"]}}
                sign = f"{base}/bench/tables/t/sign"
                isbre = median_of(RUNS, partial(signer_latency_ms, client, sign, body, requests))
                local = median_of(RUNS, partial(local_signing_ms, uri, requests))
                report.add(name, isbre, local, f"{isbre / local:.1f}x")
    finally:
        server.stop()
        moto.stop()
    return report
