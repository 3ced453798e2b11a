"""The web console at /ui, in a real headless Chromium against a real server.

Screenshots of each page go to $ISBRE_CONSOLE_SCREENSHOTS when it is set (docs/console.md
shows the ones taken with it set to docs/console), else to the test's temporary directory.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
from isbre.rest.auth import sha256_hex
from playwright.sync_api import Browser, Page, expect
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import SortField, SortOrder
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    DoubleType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
)
from pyiceberg.view.metadata import SQLViewRepresentation, ViewRepresentation, ViewVersion

from tests.browser import NARROW, WIDE, Watched, chromium, chromium_path, watched
from tests.conftest import server_settings
from tests.crafted import snapshot_updates
from tests.http_client import http
from tests.lineage_receiver import Receiver
from tests.relay_targets import WebhookReceiver
from tests.server import InProcessServer, IsbreServer, secured_server
from tests.waiting import eventually

HOSTILE = "<img src=x onerror=alert(1)>"
ORDERS = Schema(
    NestedField(1, "id", LongType(), required=True, doc="order number"),
    NestedField(2, "placed", TimestampType(), required=True),
    NestedField(3, "amount", DoubleType()),
    NestedField(
        4,
        "customer",
        StructType(NestedField(5, "name", StringType()), NestedField(6, "country", StringType())),
        doc="who ordered",
    ),
    NestedField(7, "tags", ListType(8, StringType(), element_required=False)),
    NestedField(9, "attributes", MapType(10, StringType(), 11, StringType(), value_required=False)),
    NestedField(12, "region", StringType()),
    identifier_field_ids=[1],
)
browser_tests = pytest.mark.skipif(
    chromium_path() is None, reason="no Chromium here: install Debian's chromium or set ISBRE_CHROMIUM"
)


def screenshot(page: Page, name: str, fallback: Path) -> None:
    folder = Path(os.environ.get("ISBRE_CONSOLE_SCREENSHOTS") or fallback)
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=folder / f"{name}.png", full_page=True)


def fits_the_window(page: Page) -> None:
    """Nothing on the page is wider than the window: no sideways scrolling."""
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= page.viewport_size["width"], f"{page.url} is {width} px wide"


def headers_are_whole(page: Page) -> None:
    """No column header is cut short (an ellipsis, or text under its neighbour)."""
    cut = page.locator("main th").evaluate_all(
        "cells => cells.filter(c => c.offsetParent && c.scrollWidth > c.clientWidth).map(c => c.textContent)"
    )
    assert cut == [], f"{page.url} cuts the headers {cut}"


def placeholders_are_whole(page: Page) -> None:
    """No input's hint is cut short: its placeholder, in the input's own font, fits inside it."""
    cut = page.locator("input[placeholder]").evaluate_all(
        """inputs => inputs.filter(input => {
            const style = getComputedStyle(input);
            const text = document.createElement("canvas").getContext("2d");
            text.font = style.font;
            const room = input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
            return input.offsetParent && text.measureText(input.placeholder).width > room;
        }).map(input => input.placeholder)"""
    )
    assert cut == [], f"{page.url} cuts the hints {cut}"


def open_streams(server: IsbreServer) -> float:
    lines = http.get(f"{server.url}/metrics").text.splitlines()
    return float(next(line for line in lines if line.startswith("isbre_event_streams ")).split()[1])


def feed_seqs(page: Page) -> list[int]:
    return [
        int(seq)
        for seq in page.locator("table.feed tbody tr").evaluate_all("rows => rows.map(r => r.dataset.seq)")
    ]


# Beyond 2^53: as a JavaScript number it would read 5954038631294500000.
BIG_ID = 5954038631294499925


def add_snapshots(server: IsbreServer, identifier: str, ids: list[int]) -> None:
    """Snapshots with the given ids, each the child of the one before, all sharing the current
    snapshot's manifest list (what they hold does not matter to the pages that show them)."""
    namespace, name = identifier.split(".")
    table = RestCatalog("ids", uri=server.url).load_table(identifier)
    metadata = table.metadata
    parent = metadata.current_snapshot_id
    manifest_list = metadata.current_snapshot().manifest_list
    sequence = metadata.last_sequence_number
    url = f"{server.url}/v1/isbre/namespaces/{namespace}/tables/{name}"
    for snapshot_id in ids:
        sequence += 1
        updates = snapshot_updates(metadata, snapshot_id, parent, sequence, manifest_list)
        requirements = [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": parent}]
        answer = http.post(url, json={"requirements": requirements, "updates": updates})
        assert answer.status_code == 200, answer.text
        parent = snapshot_id


def rows(schema: pa.Schema, count: int, first: int = 0) -> pa.Table:
    """Orders `first`.. with the nested columns left empty, in the table's Arrow schema."""
    placed = 1_700_000_000_000_000
    return pa.Table.from_pylist(
        [
            {"id": i, "placed": placed + i * 60_000_000, "amount": i * 1.5}
            for i in range(first, first + count)
        ],
        schema=schema,
    )


def seed(catalog: RestCatalog) -> None:
    """A small catalog with something on every page: nested namespaces, a partitioned and sorted
    table with snapshots and a tag, declared lineage, sink coverage with a gap, a view."""
    for namespace in ("sales", "sales.eu", "raw"):
        catalog.create_namespace(namespace, {"owner": "data-eng"} if namespace == "sales" else {})
    catalog.create_table("raw.customers", Schema(NestedField(1, "id", LongType(), required=True)))
    spec = PartitionSpec(PartitionField(12, 1000, IdentityTransform(), "region"))
    order = SortOrder(SortField(1, IdentityTransform()))
    orders = catalog.create_table(
        "sales.orders", ORDERS, partition_spec=spec, sort_order=order, properties={"comment": "every order"}
    )
    source = {"source-id": "kafka-prod", "topic": "orders"}
    spans = [
        {**source, "partition": 0, "start": 0, "end": 500},
        {**source, "partition": 1, "start": 0, "end": 300},
    ]
    lineage = {
        "isbre.lineage.job": "nightly.orders_load",
        "isbre.lineage.inputs": json.dumps(
            ["raw.customers", {"namespace": "kafka://prod", "name": "orders"}]
        ),
        "isbre.lineage.column-lineage": json.dumps(
            {
                "amount": [{"namespace": "kafka://prod", "name": "orders", "field": "total"}],
                "customer_id": [{"table": "raw.customers", "field": "id"}],  # a column of the catalog's
            }
        ),
    }
    counted = {"isbre.sink.rows": json.dumps({"accepted": 500, "quarantined.dq": 3})}
    orders.append(
        rows(orders.schema().as_arrow(), 500), {"isbre.sink.spans": json.dumps(spans), **counted, **lineage}
    )
    later = [{**source, "partition": 0, "start": 700, "end": 900}]
    counted = {"isbre.sink.rows": json.dumps({"accepted": 200, "shed.dq": 2})}
    orders.append(
        rows(orders.schema().as_arrow(), 200, 700), {"isbre.sink.spans": json.dumps(later), **counted}
    )
    orders = catalog.load_table("sales.orders")
    orders.manage_snapshots().create_tag(orders.metadata.snapshots[0].snapshot_id, "first-load").commit()
    version = ViewVersion(
        version_id=1,
        schema_id=0,
        timestamp_ms=int(time.time() * 1000),
        summary={"engine-name": "spark"},
        representations=[
            ViewRepresentation(
                SQLViewRepresentation(
                    type="sql", sql="SELECT id, amount FROM sales.orders WHERE amount > 100", dialect="spark"
                )
            )
        ],
        default_namespace=["sales"],
    )
    catalog.create_view("sales.big_orders", Schema(NestedField(1, "id", LongType())), version)


@pytest.fixture(scope="module")
def hook() -> Iterator[WebhookReceiver]:
    running = WebhookReceiver().start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, receiver: Receiver, hook: WebhookReceiver
) -> Iterator[IsbreServer]:
    """A server with lineage on (delivered to a receiver), a webhook relay, and the seeded catalog."""
    relay = {"kind": "webhook", "name": "console-hook", "url": hook.url, "secret": "whsec_" + "A" * 32}
    env = {"ISBRE_LINEAGE_URL": receiver.url, "ISBRE_RELAYS": json.dumps([relay])}
    started = InProcessServer(tmp_path_factory.mktemp("console") / "warehouse", env=env).start()
    seed(RestCatalog("seed", uri=started.url))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


@pytest.fixture
def seen(browser: Browser) -> Iterator[Watched]:
    found = watched(browser)
    yield found
    found.page.close()


def open_page(seen: Watched, server: IsbreServer, route: str) -> Page:
    seen.page.goto(f"{server.url}/ui/#/{route}")
    return seen.page


def live(page: Page) -> None:
    expect(page.locator("#connection")).to_have_text("live")


def test_console_is_served_with_a_strict_policy(server: IsbreServer) -> None:
    page = http.get(f"{server.url}/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy and "unsafe" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    assert http.get(f"{server.url}/ui/app.js").headers["content-type"].startswith("text/javascript")
    # Only the files the console ships: no path reaches another file.
    for name in ("../rest/app.py", "..%2Fpyproject.toml", "routes.py", "missing.js"):
        assert http.get(f"{server.url}/ui/{name}").status_code == 404
    assert http.get(f"{server.url}/ui", follow_redirects=False).headers["location"] == "/ui/"


def test_console_can_be_switched_off(tmp_path: Path) -> None:
    server = InProcessServer(tmp_path / "warehouse", env={"ISBRE_CONSOLE": "false"}).start()
    try:
        assert http.get(f"{server.url}/ui/").status_code == 404
    finally:
        server.stop()


@browser_tests
def test_every_page_loads_clean(server: IsbreServer, seen: Watched, tmp_path: Path) -> None:
    """No console error, no uncaught exception, no request leaving loopback, on any page."""
    ns = "sales"
    open_page(seen, server, "feed").wait_for_selector("table.feed")
    pages = {
        "catalog": ("catalog", 'section li li a[href$="sales%1Feu"]'),  # nested namespaces, nested
        "namespace": (f"namespace/isbre/{ns}", "text=orders"),
        "table": (f"table/isbre/{ns}/orders", "table.schema"),
        "view": (f"view/isbre/{ns}/big_orders", "pre.sql"),
        "lineage": (f"lineage/isbre/{ns}/orders", "svg.graph"),
        "coverage": (f"coverage/isbre/{ns}/orders", "svg.coverage"),
    }
    pages["feed"] = ("feed", "table.feed tbody tr")
    pages["operations"] = ("operations", "[data-component=store]")
    for viewport, suffix in ((WIDE, ""), (NARROW, "-narrow")):
        seen.page.set_viewport_size(viewport)
        for name, (route, ready) in pages.items():
            page = open_page(seen, server, route)
            page.wait_for_selector(ready)
            # Everything the page draws is in elements: stray text ("null", "undefined") is a slip.
            stray = "[...document.querySelector('main').childNodes].filter(n => n.nodeType === 3)"
            assert page.evaluate(f"{stray}.map(n => n.textContent)") == [], name
            assert "undefined" not in page.locator("main").inner_text(), name
            fits_the_window(page)
            headers_are_whole(page)
            placeholders_are_whole(page)
            screenshot(page, name + suffix, tmp_path)
    seen.clean()


@browser_tests
def test_ids_beyond_2_to_the_53_are_shown_exactly(server: IsbreServer, seen: Watched) -> None:
    add_snapshots(server, "sales.orders", [BIG_ID])
    metadata = RestCatalog("reader", uri=server.url).load_table("sales.orders").metadata
    page = open_page(seen, server, "table/isbre/sales/orders")
    shown = page.locator(f'li[data-snapshot-id="{BIG_ID}"]')
    expect(shown.locator("code.snapshot-id")).to_have_text(str(BIG_ID))
    assert "current" in (shown.get_attribute("class") or "")  # compared as the exact id
    expect(shown).to_contain_text(f"sequence {metadata.last_sequence_number}")
    for snapshot in metadata.snapshots[-10:]:
        item = page.locator(f'li[data-snapshot-id="{snapshot.snapshot_id}"]')
        expect(item.locator("code.snapshot-id")).to_have_text(str(snapshot.snapshot_id))
        if snapshot.parent_snapshot_id is not None:
            expect(item.locator("code.parent-id")).to_have_text(str(snapshot.parent_snapshot_id))
    # A ref on the id: the ref map is keyed by the exact id too.
    expect(shown.locator(".ref")).to_have_text("main")
    seen.clean()


@browser_tests
def test_the_table_page_shows_the_newest_and_more_on_asking(
    server: IsbreServer, seen: Watched, tmp_path: Path
) -> None:
    catalog = RestCatalog("writer", uri=server.url)
    catalog.create_table("sales.busy", Schema(NestedField(1, "id", LongType(), required=True)))
    table = catalog.load_table("sales.busy")
    table.append(pa.Table.from_pylist([{"id": 1}], schema=table.schema().as_arrow()))
    consumer = http.put(
        f"{server.url}/v1/isbre/namespaces/sales/tables/busy/consumers/billing", json={"commit-seq": 0}
    )
    assert consumer.status_code == 200, consumer.text
    add_snapshots(server, "sales.busy", [BIG_ID + i for i in range(1, 31)])
    metadata = catalog.load_table("sales.busy").metadata
    page = open_page(seen, server, "table/isbre/sales/busy")
    # Behind by every commit that added a snapshot (the append and thirty more), and the append's row.
    billing = page.locator("table.consumers tr[data-consumer=billing] td")
    expect(billing).to_have_text(["billing", "0", "31", "1", "live"])
    timeline = page.locator("ol.timeline > li")
    expect(timeline).to_have_count(10)
    newest = sorted(metadata.snapshots, key=lambda s: s.timestamp_ms)[-1]
    assert timeline.first.get_attribute("data-snapshot-id") == str(newest.snapshot_id)
    snapshots = page.locator("section", has_text="Snapshots and refs")
    expect(snapshots).to_contain_text("21 older not shown")
    for viewport, suffix in ((NARROW, "-narrow"), (WIDE, "")):
        page.set_viewport_size(viewport)
        fits_the_window(page)
        screenshot(page, "table-many-snapshots" + suffix, tmp_path)
    snapshots.get_by_role("button", name="show 20 more").click()
    expect(timeline).to_have_count(30)
    snapshots.get_by_role("button", name="show 1 more").click()
    expect(timeline).to_have_count(31)
    # Files below the table's location show as their part below it; the whole URI on hover.
    files = page.locator("ol.files code.path")
    expect(files).to_have_count(10)
    for each in files.all():
        full = each.get_attribute("title") or ""
        assert full.startswith(metadata.location + "/") and full.endswith(".metadata.json")
        assert each.inner_text() == full.removeprefix(metadata.location + "/")
    assert page.locator("table.schema thead th").all_inner_texts()[3] == "nullability"
    maintenance = page.locator("table.maintenance")
    expect(maintenance.locator("tr", has_text="snapshots").locator("td")).to_have_text(
        str(len(metadata.snapshots))
    )
    expect(maintenance.locator("tr", has_text="maintained by").locator("td")).to_have_text("no")
    seen.clean()


@browser_tests
def test_the_table_page_says_which_snapshots_the_catalog_rebased(server: IsbreServer, seen: Watched) -> None:
    catalog = RestCatalog("writer", uri=server.url)
    catalog.create_table("sales.hot", Schema(NestedField(1, "id", LongType(), required=True)))
    first, second = catalog.load_table("sales.hot"), catalog.load_table("sales.hot")
    batch = pa.Table.from_pylist([{"id": 1}], schema=first.schema().as_arrow())
    first.append(batch)
    first.append(batch)
    second.append(batch)  # made on the empty table, rebased on the first's second append
    snapshots = catalog.load_table("sales.hot").snapshots()
    page = open_page(seen, server, "table/isbre/sales/hot")
    expect(page.locator(f'li[data-snapshot-id="{snapshots[-1].snapshot_id}"] .rebased')).to_have_text(
        "rebased by the catalog: its writer made it on an empty table"
    )
    expect(page.locator(".rebased")).to_have_count(1)
    seen.clean()


@browser_tests
def test_the_feed_opens_with_the_latest_commits(server: IsbreServer, seen: Watched) -> None:
    high = server.high_water()
    page = open_page(seen, server, "feed")
    live(page)
    seqs = feed_seqs(page)
    assert seqs[0] == high and len(seqs) == min(50, high)
    assert seqs == sorted(seqs, reverse=True)
    expect(page.locator("main")).to_contain_text(f"{len(seqs)} recent commits from the log")
    seen.clean()


@browser_tests
def test_a_commit_appears_in_the_feed_as_it_lands(server: IsbreServer, seen: Watched) -> None:
    """Drawn from the live stream (how soon: `make bench console`)."""
    page = open_page(seen, server, "feed")
    live(page)
    table = RestCatalog("writer", uri=server.url).load_table("sales.orders")
    table.append(rows(table.schema().as_arrow(), 10, 5000))
    seq = server.high_water()
    row = page.locator(f'tr[data-seq="{seq}"]')
    row.wait_for(timeout=10_000)
    cells = row.locator("td").all_inner_texts()
    assert cells[2:7] == ["table.commit", "sales.orders", "append", "10", "1"]
    seen.clean()


@browser_tests
def test_the_feeds_rate_is_the_last_point_of_its_line(server: IsbreServer, seen: Watched) -> None:
    """The figure beside the sparkline is its last whole second, and its peak the line's peak; every
    commit the page saw arrive is on the line."""
    page = open_page(seen, server, "feed")
    live(page)
    with httpx.Client(base_url=f"{server.url}/v1/isbre") as client:
        for i in range(20):
            answer = client.post("/namespaces/raw/properties", json={"updates": {"burst": str(i)}})
            assert answer.status_code == 200
    counted = "JSON.parse(document.querySelector('.rate').dataset.values || '[]').reduce((a, b) => a + b, 0)"
    page.wait_for_function(f"() => {counted} === 20", timeout=5000)
    shown = page.locator(".rate").evaluate("r => [r.textContent, JSON.parse(r.dataset.values)]")
    text, values = shown
    figure, peak = re.fullmatch(r"\s*(\d+)/s · peak (\d+)/s", text).groups()
    assert (int(figure), int(peak)) == (values[-1], max(values))
    assert int(peak) > 0
    seen.clean()


@browser_tests
def test_pause_and_resume_misses_nothing(server: IsbreServer, seen: Watched) -> None:
    page = open_page(seen, server, "feed")
    live(page)
    page.get_by_role("button", name="Pause").click()
    expect(page.locator("#connection")).to_have_text("paused")
    # Paused is no stream at all: nothing can reach the page until it resumes.
    eventually(lambda: open_streams(server) == 0, "the paused page's stream closed")
    before = server.high_water()
    with httpx.Client(base_url=f"{server.url}/v1/isbre") as client:
        for i in range(50):
            answer = client.post("/namespaces/sales/properties", json={"updates": {"step": str(i)}})
            assert answer.status_code == 200
    assert max(feed_seqs(page)) <= before
    page.get_by_role("button", name="Resume").click()
    expected = list(range(before + 50, before, -1))  # newest first
    expect(page.locator(f'table.feed tbody tr[data-seq="{before + 50}"]')).to_be_visible()
    assert [seq for seq in feed_seqs(page) if seq > before] == expected
    live(page)
    seen.clean()


@browser_tests
def test_operations_reads_rate_and_latency_off_the_metrics(
    server: IsbreServer, seen: Watched, tmp_path: Path, hook: WebhookReceiver
) -> None:
    page = open_page(seen, server, "operations")
    expect(page.locator("[data-component=store]")).to_contain_text("ok")
    health = page.locator("section", has_text="Health")
    assert "null" not in health.inner_text()
    expect(health.locator("[data-component=lineage] > .status")).to_have_text("ok")
    expect(health.locator("[data-component=relays] > .status")).to_have_text("ok")
    expect(health.locator("[data-component=console-hook]")).to_contain_text(hook.url)
    with httpx.Client(base_url=f"{server.url}/v1/isbre") as client:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # commits across two polls of /metrics
            client.post("/namespaces/raw/properties", json={"updates": {"at": str(time.time())}})
            time.sleep(0.05)
    expect(page.locator("[data-figure=p50] strong")).to_contain_text("ms")
    assert float(page.locator("[data-figure=rate] strong").inner_text().removesuffix("/s")) > 0
    expect(page.locator("[data-figure=seq] strong")).to_have_text(str(server.high_water()), timeout=5000)
    screenshot(page, "operations", tmp_path)
    seen.clean()


@browser_tests
def test_feed_filters_are_the_streams_own(server: IsbreServer, seen: Watched) -> None:
    page = open_page(seen, server, "feed")
    live(page)
    page.locator("select[name=kind]").select_option("table.commit")
    page.locator("input[name=namespace]").fill("sales")
    page.locator("input[name=namespace]").dispatch_event("change")
    live(page)
    before = server.high_water()
    # The page opens on the log's recent commits that the filters select, then follows.
    opening = page.locator("table.feed tbody tr")
    expect(opening.first).to_be_visible()
    # The connection may still say "live" from before the filters changed: the page has switched
    # once no row of another kind is left.
    expect(opening.locator("td.c-kind", has_not_text="table.commit")).to_have_count(0)
    assert set(opening.locator("td.c-kind").all_inner_texts()) == {"table.commit"}
    assert all(name.startswith("sales.") for name in opening.locator("td.c-object").all_inner_texts())
    catalog = RestCatalog("writer", uri=server.url)
    catalog.update_namespace_properties("sales", updates={"filtered": "out"})  # another kind
    with catalog.load_table("raw.customers").transaction() as txn:  # another namespace
        txn.set_properties(filtered="out")
    with catalog.load_table("sales.orders").transaction() as txn:
        txn.set_properties(filtered="in")
    seq = server.high_water()
    expect(page.locator("table.feed tbody tr").first).to_have_attribute("data-seq", str(seq))
    assert [each for each in feed_seqs(page) if each > before] == [seq]
    seen.clean()


@browser_tests
def test_table_page_follows_a_schema_change(server: IsbreServer, seen: Watched) -> None:
    page = open_page(seen, server, "table/isbre/sales/orders")
    schema = page.locator("table.schema")
    expect(schema).to_contain_text("order number")
    table = RestCatalog("writer", uri=server.url).load_table("sales.orders")
    # Nested fields under their parents, each with the id the catalog gave it.
    for path, shown in (
        ("customer.country", "country"),
        ("attributes.value", "value"),
        ("tags.element", "element"),
    ):
        field_id = table.schema().find_field(path).field_id
        expect(schema.locator(f"[data-field-id='{field_id}'] td.depth-1")).to_have_text(shown)
    live(page)
    page.evaluate("window.notReloaded = true")
    with table.update_schema() as update:
        update.add_column("channel", StringType(), doc="where it was placed")
    expect(schema.locator("tr", has_text="channel")).to_contain_text("where it was placed")
    assert page.evaluate("window.notReloaded") is True
    seen.clean()


@browser_tests
def test_lineage_graph_shows_declared_inputs_and_downstream(server: IsbreServer, seen: Watched) -> None:
    page = open_page(seen, server, "lineage/isbre/sales/orders")
    graph = page.locator("svg.graph")
    expect(graph.locator("[data-dataset='raw.customers']")).to_be_visible()
    expect(graph.locator("[data-dataset='orders']")).to_contain_text("kafka://prod")
    expect(page.locator("main")).to_contain_text("nightly.orders_load")
    columns = page.locator("section", has_text="Column lineage")
    expect(columns.locator("tr", has_text="amount")).to_contain_text("kafka://prod/orders.total")
    catalogs = columns.locator("tr", has_text="customer_id")
    expect(catalogs).to_contain_text("raw.customers.id")
    expect(catalogs.locator("a")).to_have_attribute("href", "#/table/isbre/raw/customers")
    outbox = page.locator("section", has_text="Lineage outbox")
    expect(outbox.locator("[data-field=delivering]")).to_have_text("delivering yes")
    expect(outbox.locator("[data-field=backlog]")).to_have_text("backlog 0", timeout=15_000)
    expect(outbox.locator("[data-field=events_sent]")).not_to_have_text("events sent 0")
    # A status, not a dump: nothing that is not there (no error yet, no failures listed) is shown.
    assert outbox.locator("[data-field=last_error], [data-field=recent_failures]").count() == 0
    assert "null" not in outbox.inner_text()
    # The other way: the input's page finds the table that declares it.
    page = open_page(seen, server, "lineage/isbre/raw/customers")
    expect(page.locator("svg.graph .node-output")).to_have_attribute("data-dataset", "sales.orders")
    seen.clean()


@browser_tests
def test_coverage_shows_ranges_gaps_and_lag(server: IsbreServer, seen: Watched) -> None:
    page = open_page(seen, server, "coverage/isbre/sales/orders")
    first = page.locator("tr[data-partition='0']")
    expect(first).to_contain_text("[500, 700)")  # the gap between the two loads
    expect(first.locator("rect.gap")).to_have_count(1)
    behind = page.locator("tr[data-partition='1'] td").last
    expect(behind).to_have_text("600")  # partition 1 ends at 300, partition 0 at 900
    counts = page.locator("table.sink-rows tbody tr")
    expect(counts).to_have_text(["accepted700", "quarantineddq3", "sheddq2"])
    seen.clean()


@browser_tests
def test_hostile_names_render_as_text(server: IsbreServer, seen: Watched) -> None:
    catalog = RestCatalog("writer", uri=server.url)
    catalog.create_namespace(HOSTILE)
    page = open_page(seen, server, "feed")
    live(page)
    catalog.create_table((HOSTILE, HOSTILE), Schema(NestedField(1, HOSTILE, StringType(), doc=HOSTILE)))
    expect(page.locator("table.feed tbody")).to_contain_text(f"{HOSTILE}.{HOSTILE}")
    page.locator("table.feed tbody a").first.click()
    expect(page.locator("h1")).to_have_text(HOSTILE)
    expect(page.locator("table.schema")).to_contain_text(HOSTILE)
    expect(open_page(seen, server, "catalog").locator("main section li", has_text=HOSTILE)).to_be_visible()
    page = open_page(seen, server, f"namespace/isbre/{HOSTILE}")
    expect(page.locator("main h1")).to_have_text(HOSTILE)
    expect(page.locator("main section", has_text="Tables").locator("li")).to_have_text(HOSTILE)
    assert page.locator("main img").count() == 0
    seen.clean()


PRINCIPALS = [
    {
        "name": "ops-admin",
        "roles": ["admin"],
        "client_id": "admin",
        "secret_sha256": sha256_hex("admin-secret"),
    },
    {
        "name": "sales-reader",
        "roles": ["reader"],
        "namespaces": ["sales"],
        "client_id": "reader",
        "secret_sha256": sha256_hex("reader-secret"),
    },
]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsbreServer]:
    started = secured_server(tmp_path_factory.mktemp("console-auth") / "warehouse", PRINCIPALS)
    admin = RestCatalog("admin", uri=started.url, credential="admin:admin-secret")
    for namespace in ("sales", "other"):
        admin.create_namespace(namespace)
        admin.create_table(f"{namespace}.t", Schema(NestedField(1, "id", LongType(), required=True)))
    yield started
    started.stop()


def sign_in(page: Page, client_id: str, secret: str) -> None:
    page.get_by_label("Client id").fill(client_id)
    page.get_by_label("Secret").fill(secret)
    page.get_by_role("button", name="Sign in").click()


@browser_tests
def test_a_scoped_reader_sees_only_its_namespace(secured: IsbreServer, seen: Watched) -> None:
    page = open_page(seen, secured, "catalog")
    sign_in(page, "reader", "wrong")
    expect(page.locator("form.signin .error")).to_contain_text("wrong secret")
    seen.errors.clear()  # the browser logs the refused sign-in (401) as an error
    sign_in(page, "reader", "reader-secret")
    expect(page.locator("main section")).to_contain_text("sales")
    assert "other" not in page.locator("main").inner_text()
    page = open_page(seen, secured, "feed")
    live(page)
    rows = page.locator("table.feed tbody tr")
    # What the reader may see of the log's recent commits: sales and its table, nothing of other.
    expect(rows).to_have_count(2)
    assert rows.locator("td.c-object").all_inner_texts() == ["sales.t", "sales"]
    admin = RestCatalog("admin", uri=secured.url, credential="admin:admin-secret")
    for namespace in ("other", "sales"):
        with admin.load_table(f"{namespace}.t").transaction() as txn:
            txn.set_properties(touched="yes")
    expect(rows).to_have_count(3)
    assert rows.first.locator("td").all_inner_texts()[3:8] == ["sales.t", "", "", "", "ops-admin"]
    page = open_page(seen, secured, "namespace/isbre/other")
    expect(page.locator("main .error")).to_contain_text("may not use namespace other")
    seen.errors.clear()  # the refused request (403), logged by the browser
    # Nothing on the page writes: the console only reads, whatever the caller's role.
    seen.clean()


@browser_tests
def test_an_expired_token_asks_to_sign_in_again(tmp_path: Path, seen: Watched) -> None:
    server = secured_server(tmp_path / "warehouse", PRINCIPALS, ISBRE_AUTH__TOKEN_TTL_SECONDS="3")
    try:
        page = open_page(seen, server, "feed")
        sign_in(page, "reader", "reader-secret")
        live(page)
        # The stream ends with the token; the console asks for credentials instead of failing.
        expect(page.locator("form.signin .error")).to_contain_text("expired", timeout=10_000)
        sign_in(page, "reader", "reader-secret")
        live(page)
        seen.errors.clear()  # requests refused with the expired token, logged by the browser
        seen.clean()
    finally:
        server.stop()


def test_the_suites_own_settings_survive_its_start() -> None:
    """The screenshot folder (docs/console.md) and Chromium's path reach the tests; a server
    setting does not."""
    environ = {
        "ISBRE_CONSOLE_SCREENSHOTS": "docs/console",
        "ISBRE_CHROMIUM": "/usr/bin/chromium",
        "ISBRE_PORT": "1",
        "OPENLINEAGE_URL": "http://x",
        "HOME": "/root",
    }
    assert sorted(server_settings(environ)) == ["ISBRE_PORT", "OPENLINEAGE_URL"]
