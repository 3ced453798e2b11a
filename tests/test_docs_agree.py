"""The docs say what the code does: every setting and its default, every command-line option,
and the limits the code enforces, as the pages state them."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest
from isbre.catalog.append_rebase import MAX_REBASES, OUTCOMES
from isbre.catalog.identifiers import MAX_KEY_BYTES, MAX_NAME_BYTES, MAX_NAMESPACE_DEPTH
from isbre.catalog.table_properties import REBASE_APPENDS
from isbre.rest.cli import build_parser
from isbre.rest.event_pages import SCAN_LIMIT
from isbre.rest.event_stream import RECENT_LIMIT, RECENT_SCAN_LIMIT
from isbre.rest.settings import Settings
from pydantic import BaseModel

ROOT = Path(__file__).parent.parent
DOCS = {page.name: page.read_text() for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
EVERYTHING = "\n".join(DOCS.values())
# A table row that names one setting in backticks and gives its default as one backticked value.
ROW = re.compile(r"^\| `([a-z0-9_.]+)` \| `([^`|]*)` \|", re.M)
COMMANDS = [
    ["serve"],
    ["events", "tail"],
    ["lineage", "status"],
    ["lineage", "replay"],
    ["store", "migrate"],
    ["store", "copy"],
    ["ingest"],
    ["tail"],
]


def settings_of(model: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    """Every setting by its documented name (`auth.enabled`), with its default (None: a factory)."""
    found: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel) and name != "warehouses":
            found |= settings_of(annotation, f"{prefix}{name}.")
        else:
            found[prefix + name] = None if info.default_factory is not None else info.default
    return found


SETTINGS = settings_of(Settings)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_every_setting_is_documented(name: str) -> None:
    # Named in backticks, or as a TOML table (`[[auth.principals]]`, `[warehouses.<name>]`).
    spellings = (f"`{name}`", f"`{name}.", f"[{name}]", f"[[{name}]]", f"[{name}.")
    assert any(spelling in EVERYTHING for spelling in spellings), name


def same(documented: str, default: Any) -> bool:
    if isinstance(default, bool):
        return documented == str(default).lower()
    if isinstance(default, int | float):
        with contextlib.suppress(ValueError):
            return float(documented.replace(",", "")) == float(default)
        return False
    if isinstance(default, list):
        return documented == "[]" and not default
    return documented.removeprefix("./") == str(default)


def test_documented_defaults_are_the_codes() -> None:
    checked, wrong = 0, []
    for page, text in DOCS.items():
        if page == "sinks.md":  # a sink's own options, some of which share a server setting's name
            continue
        for name, documented in ROW.findall(text):
            for candidate in (name, f"delegation.{name}", f"s3.{name}", f"auth.{name}"):
                if candidate in SETTINGS and SETTINGS[candidate] is not None:
                    checked += 1
                    if not same(documented, SETTINGS[candidate]):
                        wrong.append(f"{page}: {name} documented as {documented}, is {SETTINGS[candidate]!r}")
                    break
    assert not wrong, wrong
    assert checked >= 25  # the tables were read: most settings have a plain default


def help_of(command: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--help"])
    return out.getvalue()


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_option_is_documented(command: list[str]) -> None:
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", help_of(command))) - {"--help"}
    assert options
    missing = [option for option in sorted(options) if option not in EVERYTHING]
    assert not missing, f"isbre {' '.join(command)}: {missing} not in README.md or docs/"


def test_the_commands_are_the_ones_checked() -> None:
    listed = re.search(r"\{([a-z,]+)\}", help_of([]))
    assert listed is not None
    assert sorted(listed.group(1).split(",")) == sorted({command[0] for command in COMMANDS})


@pytest.mark.parametrize(
    ("page", "phrase"),
    [
        ("rest-api.md", f"up to {MAX_NAME_BYTES} bytes of UTF-8 ({MAX_KEY_BYTES} for a namespace"),
        ("rest-api.md", f"deeper than {MAX_NAMESPACE_DEPTH} levels"),
        ("events.md", f"at most {RECENT_LIMIT:,}"),
        ("events.md", f"at most {RECENT_SCAN_LIMIT:,} records per request"),
        ("events.md", f"examines at most {SCAN_LIMIT:,} records"),
        ("commits.md", f"is made again on the newer head, up to {MAX_REBASES} times"),
        ("commits.md", f"gave up after rebasing it {MAX_REBASES} times"),
        ("commits.md", ", ".join(f"`{outcome}`" for outcome in OUTCOMES)),
        ("commits.md", f"| `{REBASE_APPENDS}=false` on the table"),
    ],
)
def test_documented_limits_are_the_codes(page: str, phrase: str) -> None:
    assert phrase in " ".join(DOCS[page].split()), phrase
