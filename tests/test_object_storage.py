"""Warehouses on S3: a real S3 endpoint (moto in server mode, enforcing signatures and IAM policies)
on loopback, engines holding no S3 credentials of their own, and a local warehouse beside it."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError
from isbre.catalog.object_storage import ObjectStorageIO
from isbre.events.change_reads import read_tasks
from isbre.sinks.parquet import ParquetSink
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.rest.scan_planning import PlanCompleted
from pyiceberg.expressions import EqualTo
from pyiceberg.utils.concurrent import ExecutorFactory

from tests import duck, zygote
from tests.crafted import crafted_snapshot
from tests.http_client import http
from tests.openapi import check
from tests.s3 import REGION, MotoS3
from tests.server import ID_SCHEMA, IsbreServer, on_threads
from tests.sink_helpers import crash_and_replay, rows, span

READER, WRITER = "reader-token", "writer-token"
PRINCIPALS = [
    {"name": "reader", "roles": ["reader"], "token_sha256": hashlib.sha256(READER.encode()).hexdigest()},
    {"name": "writer", "roles": ["admin"], "token_sha256": hashlib.sha256(WRITER.encode()).hexdigest()},
]
SCHEMA = pa.schema([pa.field("id", pa.int64())])
DENIED = r"(?i)access[ _]?denied|forbidden"


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    endpoint = MotoS3.start(tmp_path_factory.mktemp("moto") / "moto.log")
    yield endpoint
    endpoint.stop()


@pytest.fixture(autouse=True)
def no_s3_credentials_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engines in these tests get S3 access only from isbre."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def s3_server(moto: MotoS3, home: Path, secured: bool = False) -> IsbreServer:
    """A server whose default warehouse is s3://lake/wh, with a local warehouse `local` beside it."""
    env = moto.server_env() | {"ISBRE_WAREHOUSES": json.dumps({"local": {"root": str(home / "local")}})}
    if secured:
        env |= {
            "ISBRE_AUTH__ENABLED": "true",
            "ISBRE_AUTH__TOKEN_SECRET": "test-signing-key",
            "ISBRE_AUTH__PRINCIPALS": json.dumps(PRINCIPALS),
        }
    home.mkdir(parents=True, exist_ok=True)
    server = IsbreServer("s3://lake/wh", env=env, store=home / "isbre.lmdb")
    if secured:
        server.ready_path = "/live"
    return server.start()


@pytest.fixture(scope="module")
def on_s3(moto: MotoS3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsbreServer]:
    running = s3_server(moto, tmp_path_factory.mktemp("isbre-s3"), secured=True)
    yield running
    running.stop()


def catalog(server: IsbreServer, token: str, delegation: str = "vended-credentials") -> RestCatalog:
    properties = {"uri": server.url, "token": token, "header.X-Iceberg-Access-Delegation": delegation}
    if delegation == "remote-signing":
        properties["s3.region"] = REGION
    return RestCatalog("isbre", **properties)


def round_trip(lake: RestCatalog, namespace: str) -> None:
    """Create, append twice, scan, and time-travel to the first snapshot."""
    lake.create_namespace_if_not_exists(namespace)
    table = lake.create_table(f"{namespace}.t", schema=SCHEMA)
    assert table.metadata.location.startswith(f"s3://lake/wh/{namespace}/t-")
    table.append(pa.table({"id": [1, 2, 3]}, schema=SCHEMA))
    table.append(pa.table({"id": [4]}, schema=SCHEMA))
    table = lake.load_table(f"{namespace}.t")
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3, 4]
    first = table.metadata.snapshots[0].snapshot_id
    assert sorted(table.scan(snapshot_id=first).to_arrow()["id"].to_pylist()) == [1, 2, 3]


def test_pyiceberg_round_trip_through_vended_credentials(on_s3: IsbreServer, moto: MotoS3) -> None:
    round_trip(catalog(on_s3, WRITER), "vended")
    keys = moto.keys("lake", "wh/vended/")
    assert any(key.endswith(".parquet") for key in keys)
    assert sum(key.endswith(".metadata.json") for key in keys) == 3


def test_pyiceberg_round_trip_through_remote_signing(
    on_s3: IsbreServer, moto: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PyIceberg's scan workers race on the signer they share and send some requests unsigned
    # (apache/iceberg-python#3896): one worker, as docs/storage.md advises until that is fixed.
    monkeypatch.setenv("PYICEBERG_MAX_WORKERS", "1")
    monkeypatch.setattr(ExecutorFactory, "_instance", None)
    lake = catalog(on_s3, WRITER, "remote-signing")
    lake.create_namespace("signed")
    created = http.post(
        f"{on_s3.url}/v1/isbre/namespaces/signed/tables",
        json={"name": "probe", "schema": ID_SCHEMA},
        headers={"Authorization": f"Bearer {WRITER}", "X-Iceberg-Access-Delegation": "remote-signing"},
    ).json()
    config = created["config"]
    assert config["s3.remote-signing-enabled"] == "true"
    # The spec's remote-signing-config: the signer is at its default path, nothing else to pass.
    assert created["remote-signing-config"] == {"properties": {}, "headers": {}}
    assert config["signer.endpoint"].endswith("/namespaces/signed/tables/probe/sign")
    assert not any("access-key" in key or "session-token" in key for key in config)
    round_trip(lake, "signed")
    assert any(key.endswith(".parquet") for key in moto.keys("lake", "wh/signed/"))


def test_duckdb_reads_and_writes_through_vended_credentials(
    on_s3: IsbreServer, tmp_path: Path, moto: MotoS3
) -> None:
    con = duck.connect(tmp_path)
    con.execute(f"CREATE SECRET isbre (TYPE iceberg, TOKEN '{WRITER}')")
    con.execute(
        f"ATTACH 'isbre' AS lake (TYPE iceberg, ENDPOINT '{on_s3.url}', SECRET isbre, "
        "ACCESS_DELEGATION_MODE 'vended_credentials')"
    )
    con.execute("CREATE SCHEMA lake.duck")
    con.execute("CREATE TABLE lake.duck.t (id BIGINT, name VARCHAR)")
    con.execute("INSERT INTO lake.duck.t VALUES (1, 'a'), (2, 'b')")
    con.execute("INSERT INTO lake.duck.t VALUES (3, 'c')")
    assert con.execute("SELECT sum(id), count(*) FROM lake.duck.t").fetchone() == (6, 3)
    assert any(key.endswith(".parquet") for key in moto.keys("lake", "wh/duck/"))
    # PyIceberg sees what DuckDB wrote.
    table = catalog(on_s3, READER).load_table("duck.t")
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 2, 3]


def vended(server: IsbreServer, token: str, table: str, namespace: str = "confined") -> dict[str, str]:
    response = http.get(
        f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{table}/credentials",
        headers={"Authorization": f"Bearer {token}"},
    )
    response.raise_for_status()
    (credential,) = response.json()["storage-credentials"]
    assert credential["prefix"].startswith(f"s3://lake/wh/{namespace}/")
    return credential["config"]


def filesystem(config: dict[str, str], moto: MotoS3) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(
        access_key=config["s3.access-key-id"],
        secret_key=config["s3.secret-access-key"],
        session_token=config["s3.session-token"],
        endpoint_override=moto.endpoint,
        region=REGION,
    )


def two_tables(server: IsbreServer, moto: MotoS3, namespace: str) -> tuple[str, str, str, str]:
    """Tables a and b with a data file each: (a's root, b's root, a's file key, b's file key),
    roots as bucket/key."""
    lake = catalog(server, WRITER)
    lake.create_namespace(namespace)
    found = []
    for name in ("a", "b"):
        lake.create_table(f"{namespace}.{name}", schema=SCHEMA).append(pa.table({"id": [1]}, schema=SCHEMA))
        root = lake.load_table(f"{namespace}.{name}").metadata.location.removeprefix("s3://")
        (data,) = [k for k in moto.keys("lake", root.removeprefix("lake/")) if k.endswith(".parquet")]
        found.append((root, data))
    (a_root, a_file), (b_root, b_file) = found
    return a_root, b_root, a_file, b_file


def test_a_vended_credential_reaches_its_own_table_only_and_a_readers_cannot_write(
    on_s3: IsbreServer, moto: MotoS3
) -> None:
    a_root, b_root, a_file, b_file = two_tables(on_s3, moto, "confined")

    writer_a = filesystem(vended(on_s3, WRITER, "a"), moto)
    assert writer_a.open_input_file(f"lake/{a_file}").size() > 0
    with writer_a.open_output_stream(f"{a_root}/data/extra.bin") as out:
        out.write(b"allowed")
    for forbidden in (
        lambda: writer_a.open_input_file(f"lake/{b_file}").read(),
        lambda: writer_a.open_output_stream(f"{b_root}/data/x.bin").close(),
        lambda: writer_a.open_input_file(f"lake/{a_root.split('/', 1)[1]}-sibling/x").read(),
    ):
        with pytest.raises(OSError, match=DENIED):
            forbidden()

    reader_a = filesystem(vended(on_s3, READER, "a"), moto)
    assert reader_a.open_input_file(f"lake/{a_file}").size() > 0
    with pytest.raises(OSError, match=DENIED):
        reader_a.open_output_stream(f"{a_root}/data/y.bin").close()
    with pytest.raises(OSError, match=DENIED):
        reader_a.delete_file(f"lake/{a_file}")
    # A reader's PyIceberg session can read but not append.
    table = catalog(on_s3, READER).load_table("confined.a")
    assert table.scan().to_arrow().num_rows == 1


def sign(server: IsbreServer, token: str, table: str, method: str, uri: str) -> httpx.Response:
    return http.post(
        f"{server.url}/v1/isbre/namespaces/signing/tables/{table}/sign",
        json={"method": method, "region": REGION, "uri": uri, "headers": {}},
        headers={"Authorization": f"Bearer {token}"},
    )


def test_the_signer_signs_inside_the_table_only_and_no_writes_for_readers(
    on_s3: IsbreServer, moto: MotoS3
) -> None:
    a_root, b_root, a_file, _ = two_tables(on_s3, moto, "signing")

    inside = f"{moto.endpoint}/lake/{a_file}"
    answer = sign(on_s3, READER, "a", "GET", inside)
    assert answer.status_code == 200, answer.text
    signed = answer.json()
    # What the signer signed, the store accepts (moto checks the signature).
    headers = {name: ", ".join(values) for name, values in signed["headers"].items()}
    assert http.get(signed["uri"], headers=headers).status_code == 200
    tampered = dict(headers, Authorization=headers["Authorization"][:-4] + "0000")
    assert http.get(signed["uri"], headers=tampered).status_code == 403

    refusals = [
        (READER, "GET", f"{moto.endpoint}/{b_root}/metadata/x.json"),  # another table
        (WRITER, "PUT", f"{moto.endpoint}/{b_root}/data/x.parquet"),
        (WRITER, "GET", f"{moto.endpoint}/{a_root}/../{b_root.rsplit('/', 1)[1]}/x"),  # .. out of it
        (WRITER, "GET", f"{moto.endpoint}/{a_root}%2F..%2Fx"),
        (WRITER, "GET", f"{moto.endpoint}/lake?list-type=2&prefix=wh/signing/"),  # a wider listing
        (READER, "PUT", f"{moto.endpoint}/{a_root}/data/x.parquet"),  # a reader writing
        (READER, "DELETE", f"{moto.endpoint}/lake/{a_file}"),
    ]
    for token, method, uri in refusals:
        response = sign(on_s3, token, "a", method, uri)
        assert response.status_code == 403, (method, uri, response.text)
        assert response.json()["error"]["type"] == "ForbiddenException"
    assert sign(on_s3, WRITER, "a", "PUT", f"{moto.endpoint}/{a_root}/data/x.parquet").status_code == 200


def signed_send(
    server: IsbreServer,
    token: str,
    table: str,
    method: str,
    uri: str,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
) -> tuple[httpx.Response, httpx.Response | None]:
    """(the signer's answer, the store's answer to the signed request, when it was signed)."""
    headers = dict(headers or {})
    if body is not None:
        headers["Content-MD5"] = base64.b64encode(hashlib.md5(body).digest()).decode()
    answer = http.post(
        f"{server.url}/v1/isbre/namespaces/signing2/tables/{table}/sign",
        json={
            "method": method,
            "region": REGION,
            "uri": uri,
            "headers": {name: [value] for name, value in headers.items()},
            "body": body.decode() if body is not None else None,
        },
        headers={"Authorization": f"Bearer {token}"},
    )
    if answer.status_code != 200:
        return answer, None
    signed = answer.json()
    sent = {name: ", ".join(values) for name, values in signed["headers"].items()}
    return answer, http.request(method, signed["uri"], headers=sent, content=body)


def deletion(*keys: str) -> bytes:
    objects = "".join(f"<Object><Key>{key}</Key></Object>" for key in keys)
    return f'<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/">{objects}</Delete>'.encode()


def test_what_the_signer_signs_a_real_s3_does_and_nothing_outside_the_table(
    on_s3: IsbreServer, moto: MotoS3
) -> None:
    """The attacks that got other tables' objects deleted, copied and listed through the signer."""
    a_root, b_root, a_file, b_file = two_tables(on_s3, moto, "signing2")
    a_key, endpoint = a_root.removeprefix("lake/"), moto.endpoint
    s3 = moto.client("s3")
    s3.put_object(Bucket="lake", Key=f"{a_key}/data/scratch.bin", Body=b"x")
    # DeleteObjects "for the table's prefix" whose body names another namespace's object.
    answer, _ = signed_send(
        on_s3, WRITER, "a", "POST", f"{endpoint}/lake?delete&prefix={a_key}/", body=deletion(b_file)
    )
    assert answer.status_code == 403, answer.text
    answer, _ = signed_send(on_s3, WRITER, "a", "POST", f"{endpoint}/lake?delete", body=deletion(b_file))
    assert answer.status_code == 403, answer.text
    # Copies of another table's object into this one, by CopyObject and UploadPartCopy.
    for query in ("", "?uploadId=u&partNumber=1"):
        answer, _ = signed_send(
            on_s3, WRITER, "a", "PUT", f"{endpoint}/lake/{a_key}/data/stolen{query}",
            {"x-amz-copy-source": f"lake/{b_file}"},
        )  # fmt: skip
        assert answer.status_code == 403, answer.text
    # The whole bucket listed by a second prefix; bucket policy and ACL reads and writes.
    for method, uri in (
        ("GET", f"{endpoint}/lake?list-type=2&prefix=&prefix={a_key}/"),
        ("PUT", f"{endpoint}/lake?policy&prefix={a_key}/"),
        ("PUT", f"{endpoint}/lake?lifecycle&prefix={a_key}/"),
        ("GET", f"{endpoint}/lake?acl&prefix={a_key}/"),
        ("GET", f"{endpoint}/lake?policy"),
    ):
        for token in (READER, WRITER):
            answer, _ = signed_send(on_s3, token, "a", method, uri)
            assert answer.status_code == 403, (method, uri, answer.text)
    assert b_file in moto.keys("lake", b_root.removeprefix("lake/"))

    # What is inside the table works as signed.
    answer, listing = signed_send(on_s3, READER, "a", "GET", f"{endpoint}/lake?list-type=2&prefix={a_key}/")
    assert listing is not None and listing.status_code == 200, answer.text
    assert a_file in listing.text and b_file not in listing.text
    answer, copied = signed_send(
        on_s3,
        WRITER,
        "a",
        "PUT",
        f"{endpoint}/lake/{a_key}/data/copy.parquet",
        {"x-amz-copy-source": f"lake/{a_file}"},
    )
    assert copied is not None and copied.status_code == 200, (answer.text, copied.text)
    answer, deleted = signed_send(
        on_s3, WRITER, "a", "POST", f"{endpoint}/lake?delete", body=deletion(f"{a_key}/data/scratch.bin")
    )
    assert deleted is not None and deleted.status_code == 200, (answer.text, deleted.text)
    assert f"{a_key}/data/scratch.bin" not in moto.keys("lake", a_key)
    # The signature holds the client to the body that was judged.
    answer, _ = signed_send(
        on_s3, WRITER, "a", "POST", f"{endpoint}/lake?delete", body=deletion(f"{a_key}/data/copy.parquet")
    )
    signed = answer.json()
    forged = http.post(
        signed["uri"],
        headers={name: ", ".join(values) for name, values in signed["headers"].items()},
        content=deletion(b_file),
    )
    assert forged.status_code in (400, 403), forged.text
    assert b_file in moto.keys("lake", b_root.removeprefix("lake/"))


def test_a_vended_credential_lists_and_copies_inside_its_table_only(on_s3: IsbreServer, moto: MotoS3) -> None:
    a_root, _, a_file, b_file = two_tables(on_s3, moto, "vended2")
    config = vended(on_s3, WRITER, "a", "vended2")
    client = moto.client(
        "s3",
        aws_access_key_id=config["s3.access-key-id"],
        aws_secret_access_key=config["s3.secret-access-key"],
        aws_session_token=config["s3.session-token"],
    )
    a_key = a_root.removeprefix("lake/")
    listed = client.list_objects_v2(Bucket="lake", Prefix=f"{a_key}/")
    assert [item["Key"] for item in listed["Contents"]] == moto.keys("lake", f"{a_key}/")
    for wider in ("", "wh/", "wh/vended2/", a_key):
        with pytest.raises(ClientError, match=DENIED):
            client.list_objects_v2(Bucket="lake", Prefix=wider)
    client.copy_object(Bucket="lake", Key=f"{a_key}/data/copy.parquet", CopySource=f"lake/{a_file}")
    with pytest.raises(ClientError, match=DENIED):
        client.copy_object(Bucket="lake", Key=f"{a_key}/data/stolen.parquet", CopySource=f"lake/{b_file}")
    assert f"{a_key}/data/stolen.parquet" not in moto.keys("lake", a_key)


def test_every_s3_table_s_config_says_where_its_bucket_is(on_s3: IsbreServer, moto: MotoS3) -> None:
    """A client with S3 keys of its own, asking for no delegation, still reaches the warehouse's
    endpoint, not AWS's default one."""
    auth = {"Authorization": f"Bearer {WRITER}"}
    base = f"{on_s3.url}/v1/isbre/namespaces"
    http.post(base, json={"namespace": ["plain"]}, headers=auth).raise_for_status()
    created = http.post(f"{base}/plain/tables", json={"name": "t", "schema": ID_SCHEMA}, headers=auth).json()
    loaded = http.get(f"{base}/plain/tables/t", headers=auth).json()
    for config in (created["config"], loaded["config"]):
        assert config == {"s3.endpoint": moto.endpoint, "s3.path-style-access": "true", "s3.region": REGION}
    assert "storage-credentials" not in loaded


def test_a_local_and_an_s3_warehouse_side_by_side(on_s3: IsbreServer) -> None:
    auth = {"Authorization": f"Bearer {WRITER}"}
    config = http.get(f"{on_s3.url}/v1/config", params={"warehouse": "local"}, headers=auth).json()
    assert config["overrides"]["prefix"] == "local"
    local = RestCatalog("local", uri=on_s3.url, token=WRITER, warehouse="local")
    lake = catalog(on_s3, WRITER)
    for each in (local, lake):
        each.create_namespace("both")
        each.create_table("both.t", schema=SCHEMA).append(pa.table({"id": [7]}, schema=SCHEMA))
    assert local.load_table("both.t").metadata.location.startswith("file://")
    assert lake.load_table("both.t").metadata.location.startswith("s3://lake/wh/both/")
    local.drop_table("both.t")
    assert lake.load_table("both.t").scan().to_arrow()["id"].to_pylist() == [7]
    unknown = http.get(f"{on_s3.url}/v1/config", params={"warehouse": "nowhere"}, headers=auth)
    assert unknown.status_code == 400
    # Each warehouse's events are its own; the log's records say which warehouse.
    seen = {}
    for prefix in ("isbre", "local"):
        page = http.post(f"{on_s3.url}/v1/{prefix}/events", json={"page-size": 1000}, headers=auth).json()
        seen[prefix] = {
            e["operation"]["operation-type"]
            for e in page["events"]
            if e["operation"].get("identifier", {}).get("namespace") == ["both"]
        }
    assert seen == {
        "isbre": {"create-table", "update-table"},
        "local": {"create-table", "update-table", "drop-table"},
    }
    with http.stream(
        "GET", f"{on_s3.url}/v1/local/events", params={"after": 0, "namespace": "both"}, headers=auth
    ) as stream:
        data = (json.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data:"))
        record = next(r for r in data if r["kind"] == "table.drop")
    assert record["warehouse"] == "local"


def test_metadata_is_never_overwritten_and_a_failed_commit_leaves_nothing(
    on_s3: IsbreServer, moto: MotoS3
) -> None:
    auth = {"Authorization": f"Bearer {WRITER}"}
    http.post(f"{on_s3.url}/v1/isbre/namespaces", json={"namespace": ["racing"]}, headers=auth)
    answers: list[int] = []

    def create() -> None:
        body = {"name": "t", "schema": ID_SCHEMA}
        url = f"{on_s3.url}/v1/isbre/namespaces/racing/tables"
        answers.append(http.post(url, json=body, headers=auth, timeout=30).status_code)

    # Each create writes its own metadata file before the pointer commits; one wins.
    on_threads(lambda _: create(), range(8))
    assert sorted(answers) == [200] + [409] * 7
    winner = http.get(f"{on_s3.url}/v1/isbre/namespaces/racing/tables/t", headers=auth).json()
    # The losers removed what they wrote: the winner's file is the only object left.
    assert moto.keys("lake", "wh/racing/") == [winner["metadata-location"].removeprefix("s3://lake/")]
    with pytest.raises(FileExistsError):
        ObjectStorageIO(moto.options()).create_exclusively(winner["metadata-location"], b"{}")


def commit_until_killed(
    server: IsbreServer, table: str, key: str, acknowledged: list[tuple[str, str, int]]
) -> None:
    """Set `key` of `table` to 0, 1, 2, … until the server goes away, noting each acknowledgement."""
    with httpx.Client(timeout=30) as client:
        for value in range(10_000):
            body = {"updates": [{"action": "set-properties", "updates": {key: str(value)}}]}
            try:
                response = client.post(f"{server.url}/v1/isbre/namespaces/crash/tables/{table}", json=body)
            except httpx.TransportError:
                return
            if response.status_code == 200:
                acknowledged.append((table, key, value))


def test_kill_9_under_concurrent_commits_loses_nothing_acknowledged(moto: MotoS3, tmp_path: Path) -> None:
    server = s3_server(moto, tmp_path)
    lake = RestCatalog("isbre", uri=server.url)
    lake.create_namespace("crash")
    tables = [f"t{i}" for i in range(4)]
    for name in tables:
        lake.create_table(f"crash.{name}", schema=SCHEMA)
    acknowledged: list[tuple[str, str, int]] = []
    writers = [
        threading.Thread(target=commit_until_killed, args=(server, name, key, acknowledged))
        for name in tables
        for key in ("a", "b")
    ]
    for writer in writers:
        writer.start()
    deadline = threading.Event()
    while len(acknowledged) < 60 and not deadline.wait(0.05):
        pass
    assert server.process is not None
    server.process.send_signal(signal.SIGKILL)
    server.process.wait()
    for writer in writers:
        writer.join()
    restarted = IsbreServer(server.warehouse, env=server.env, store=server.store).start()
    try:
        s3 = moto.client("s3")
        for name in tables:
            response = http.get(f"{restarted.url}/v1/isbre/namespaces/crash/tables/{name}").json()
            location = response["metadata-location"]
            s3.head_object(Bucket="lake", Key=location.removeprefix("s3://lake/"))  # the pointer's object
            properties = response["metadata"]["properties"]
            for key in ("a", "b"):
                # Only one writer sets each key: its newest acknowledged value, or a later one, is there.
                newest = max((v for t, k, v in acknowledged if (t, k) == (name, key)), default=None)
                if newest is not None:
                    assert int(properties[key]) >= newest
        assert len(acknowledged) >= 60
    finally:
        restarted.stop()


def test_the_sink_is_exactly_once_on_s3(on_s3: IsbreServer, moto: MotoS3, tmp_path: Path) -> None:
    home = tmp_path / "open"
    open_server = s3_server(moto, home)
    try:
        lake = RestCatalog("isbre", uri=open_server.url)
        lake.create_namespace("sink")
        for crash in ("after-commit", "mid-push"):
            crash_and_replay(open_server, lake, f"sink.events_{crash.replace('-', '_')}", crash)
    finally:
        open_server.stop()


def test_ingest_and_the_raw_lane_write_to_s3_once(moto: MotoS3, tmp_path: Path) -> None:
    open_server = s3_server(moto, tmp_path / "open")
    try:
        landing = tmp_path / "landing.csv"
        landing.write_text("n,label\n1,a\n2,b\n3,c\n")
        command = [sys.executable, "-m", "isbre.rest.cli", "ingest", str(landing), "--table", "ingested.rows"]
        command += ["--uri", open_server.url]
        for _ in range(2):  # the second run finds the file's rows covered
            done = zygote.run(command, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr
        table = RestCatalog("isbre", uri=open_server.url).load_table("ingested.rows")
        assert sorted(table.scan().to_arrow()["n"].to_pylist()) == [1, 2, 3]
        assert table.metadata.location.startswith("s3://lake/wh/ingested/")
    finally:
        open_server.stop()

    raw = "s3://lake/raw/orders"
    for _ in range(2):  # a replay of the same span writes nothing
        sink = ParquetSink(raw, s3=moto.options())
        sink.push(rows(0, 100), span(0, 100))
        written = sink.finish()[0].table
    (key,) = moto.keys("lake", "raw/orders/")
    assert written == f"s3://lake/{key}"
    head = moto.client("s3").head_object(Bucket="lake", Key=key)
    assert head["ContentLength"] > 0


def test_vending_can_be_switched_off_per_warehouse(moto: MotoS3, tmp_path: Path) -> None:
    env: dict[str, Any] = moto.server_env() | {
        "ISBRE_DELEGATION__VENDED_CREDENTIALS": "false",
        "ISBRE_DELEGATION__REMOTE_SIGNING": "false",
    }
    server = IsbreServer("s3://lake/off", env=env, store=tmp_path / "isbre.lmdb").start()
    try:
        http.post(f"{server.url}/v1/isbre/namespaces", json={"namespace": ["n"]}).raise_for_status()
        for mode in ("vended-credentials", "remote-signing"):
            created = http.post(
                f"{server.url}/v1/isbre/namespaces/n/tables",
                json={"name": mode.replace("-", "_"), "schema": ID_SCHEMA},
                headers={"X-Iceberg-Access-Delegation": mode},
            ).json()
            # Only where the bucket is: no credentials, no signer.
            assert set(created["config"]) == {"s3.endpoint", "s3.path-style-access", "s3.region"}
            assert "storage-credentials" not in created and "remote-signing-config" not in created
    finally:
        server.stop()


def test_s3_locations_are_confined_to_the_warehouse(on_s3: IsbreServer) -> None:
    auth = {"Authorization": f"Bearer {WRITER}"}
    http.post(f"{on_s3.url}/v1/isbre/namespaces", json={"namespace": ["places"]}, headers=auth)
    for location in (
        "s3://other-bucket/wh/places/t",  # another bucket
        "s3://lake/elsewhere/t",  # the bucket, outside the warehouse's prefix
        "s3://lake/wh/../elsewhere/t",
        "s3a://lake/wh/places/t",  # Spark's scheme: refused, not aliased
        "s3n://lake/wh/places/t",
        "s3://lake/wh2/t",  # a sibling prefix that merely starts like the warehouse's
    ):
        response = http.post(
            f"{on_s3.url}/v1/isbre/namespaces/places/tables",
            json={"name": "t", "schema": ID_SCHEMA, "location": location},
            headers=auth,
        )
        assert response.status_code == 400, (location, response.text)
    inside = http.post(
        f"{on_s3.url}/v1/isbre/namespaces/places/tables",
        json={"name": "t", "schema": ID_SCHEMA, "location": "s3://lake/wh/custom/t"},
        headers=auth,
    )
    assert inside.status_code == 200, inside.text


def test_purge_deletes_the_tables_own_objects_only(on_s3: IsbreServer, moto: MotoS3) -> None:
    lake = catalog(on_s3, WRITER)
    lake.create_namespace("purging")
    for name in ("gone", "gone_too", "kept"):
        lake.create_table(f"purging.{name}", schema=SCHEMA).append(pa.table({"id": [1]}, schema=SCHEMA))
    kept = set(moto.keys("lake", "wh/purging/kept-"))
    gone_too = set(moto.keys("lake", "wh/purging/gone_too-"))
    # Hadoop-style writers leave zero-byte "directory" objects; an empty one goes with the table.
    root = lake.load_table("purging.gone").metadata.location.removeprefix("s3://lake/")
    moto.client("s3").put_object(Bucket="lake", Key=f"{root}/data/", Body=b"")
    lake.purge_table("purging.gone")
    assert moto.keys("lake", "wh/purging/gone-") == []
    assert set(moto.keys("lake", "wh/purging/kept-")) == kept
    assert set(moto.keys("lake", "wh/purging/gone_too-")) == gone_too


def test_an_s3_table_s_places_and_jobs_stay_inside_it(on_s3: IsbreServer, moto: MotoS3) -> None:
    """On S3, where the server's own keys reach every table: `write.data.path` into another bucket
    or another table is refused, and compaction of a table whose manifest names another table's
    object reads nothing of it (its rows never reach the table) and says so."""
    a_root, b_root, _, b_file = two_tables(on_s3, moto, "s3trust")
    url = f"{on_s3.url}/v1/isbre/namespaces/s3trust/tables/a"
    auth = {"Authorization": f"Bearer {WRITER}"}
    for place in ("s3://elsewhere/x", f"s3://{b_root}/data", "s3://lake/outside-the-warehouse"):
        body = {"updates": [{"action": "set-properties", "updates": {"write.data.path": place}}]}
        refused = http.post(url, json=body, headers=auth)
        assert refused.status_code == 400 and "write.data.path" in refused.text, (place, refused.text)
    lake = catalog(on_s3, WRITER)
    table = lake.load_table("s3trust.a")
    own = [task.file.file_path for task in table.scan().plan_files()]
    location = table.metadata.location
    updates = crafted_snapshot(
        table.metadata,
        f"{location}/metadata/snap-stolen.avro",
        [(f"{location}/metadata/stolen-m0.avro", [*own, f"s3://lake/{b_file}"])],
        io=ObjectStorageIO(moto.options()),
    )
    assert http.post(url, json={"updates": updates}, headers=auth).status_code == 200
    compacting = {"isbre.maintenance.compact.min-input-files": "2"}
    body = {"updates": [{"action": "set-properties", "updates": compacting}]}
    assert http.post(url, json=body, headers=auth).status_code == 200
    before = set(moto.keys("lake", a_root.removeprefix("lake/")))
    answer = http.post(f"{url}/maintenance", json={"jobs": ["compact-data-files"]}, headers=auth, timeout=60)
    assert answer.status_code == 200, answer.text
    (job,) = answer.json()["jobs"]
    assert not job["committed"] and f"s3://lake/{b_file}" in job["foreign-paths"], job
    assert set(moto.keys("lake", a_root.removeprefix("lake/"))) == before


def test_a_plan_on_s3_carries_credentials_for_its_table(on_s3: IsbreServer, moto: MotoS3) -> None:
    """A plan answer hands the reader vended credentials for the table's location, with which the
    planned files are read; PyIceberg planning on the server reads through them as well."""
    lake = catalog(on_s3, WRITER)
    lake.create_namespace("planned")
    table = lake.create_table("planned.t", schema=SCHEMA)
    table.append(pa.table({"id": [1, 2, 3]}, schema=SCHEMA))
    answer = http.post(
        f"{on_s3.url}/v1/isbre/namespaces/planned/tables/t/plan",
        json={"filter": {"type": "gt", "term": "id", "value": 1}},
        headers={"Authorization": f"Bearer {READER}", "X-Iceberg-Access-Delegation": "vended-credentials"},
    )
    assert check(answer).status_code == 200, answer.text
    (credential,) = answer.json()["storage-credentials"]
    assert credential["prefix"].startswith("s3://lake/wh/planned/t-")
    (task,) = answer.json()["file-scan-tasks"]
    path = task["data-file"]["file-path"]
    assert path.startswith(credential["prefix"])
    rows = pq.read_table(path.removeprefix("s3://"), filesystem=filesystem(credential["config"], moto))
    assert rows["id"].to_pylist() == [1, 2, 3]
    delegated = {"header.X-Iceberg-Access-Delegation": "vended-credentials", "scan-planning-mode": "server"}
    planning = RestCatalog("isbre", uri=on_s3.url, token=READER, **delegated)
    assert planning.supports_server_side_planning()
    scanned = planning.load_table("planned.t").scan(row_filter="id > 1").to_arrow()
    assert sorted(scanned["id"].to_pylist()) == [2, 3]


def test_a_change_plan_on_s3_nets_carried_rows_with_objects_a_purge_removes(
    on_s3: IsbreServer, moto: MotoS3
) -> None:
    """The position delete files that net out the rows a copy-on-write delete carried over are
    objects under the table's prefix, read with the table's vended credentials; a purge removes them."""
    lake = catalog(on_s3, WRITER)
    lake.create_namespace("changed")
    table = lake.create_table("changed.t", schema=SCHEMA)
    table.append(pa.table({"id": [1, 2, 3, 4]}, schema=SCHEMA))
    url = f"{on_s3.url}/v1/isbre/namespaces/changed/tables/t/plan"
    auth = {"Authorization": f"Bearer {READER}"}
    after = http.post(url, json={"filter": False}, headers=auth).json()["isbre-commit-seq"]
    table.delete(EqualTo("id", 2))  # 1, 3 and 4 written again
    delegated = {**auth, "X-Iceberg-Access-Delegation": "vended-credentials"}
    answer = http.post(url, json={"isbre-after-commit-seq": after, "isbre-changes": True}, headers=delegated)
    assert check(answer).status_code == 200, answer.text
    parsed = PlanCompleted.model_validate(answer.json())
    root = table.metadata.location.removeprefix("s3://lake/")
    carried = [d.file_path for d in parsed.delete_files or []]
    assert carried and all(path.startswith(f"s3://lake/{root}/metadata/isbre-carried-") for path in carried)
    (credential,) = answer.json()["storage-credentials"]  # as for any plan: the table's, to read them with
    assert all(path.startswith(credential["prefix"]) for path in carried)
    assert {f"s3://lake/{key}" for key in moto.keys("lake", root)} >= set(carried)
    read = {}
    for task, raw in zip(parsed.file_scan_tasks or [], answer.json()["file-scan-tasks"], strict=True):
        rows = read_tasks(lake.load_table("changed.t"), [task], parsed.delete_files or [])
        read[raw["isbre-change"]["type"]] = rows["id"].to_pylist()
    assert read == {"deleted-data-file": [2], "added-rows": []}
    lake.purge_table("changed.t")
    assert moto.keys("lake", root) == []
