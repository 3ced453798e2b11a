"""A headless Chromium for the console's tests, driven by Playwright with the system's browser.

Playwright's own browser downloads are not used: the tests run Debian's `chromium` (or the
one named by ISBRE_CHROMIUM), which `.ci/run` installs where it is missing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from playwright.sync_api import Browser, ConsoleMessage, Page, Request, sync_playwright

# Chromium's own connections (updates, sync, safe browsing) are switched off: the console's
# tests count every request that would leave loopback.
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
]


def chromium_path() -> str | None:
    named = os.environ.get("ISBRE_CHROMIUM")
    if named:
        return named
    return next((found for name in ("chromium", "chromium-browser") if (found := shutil.which(name))), None)


@contextmanager
def chromium() -> Iterator[Browser]:
    path = chromium_path()
    assert path is not None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=path, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Watched:
    """A page and what it did: console errors, uncaught exceptions, dialogs, requests off loopback."""

    page: Page
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)

    def clean(self) -> None:
        assert not self.errors, self.errors
        assert not self.dialogs, self.dialogs
        assert not self.outside, self.outside


WIDE = {"width": 1400, "height": 900}
NARROW = {"width": 420, "height": 900}


def watched(browser: Browser) -> Watched:
    page = browser.new_page(viewport=WIDE)
    seen = Watched(page)

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            seen.errors.append(message.text)

    def request(sent: Request) -> None:
        host = urlsplit(sent.url).hostname
        if sent.url.split(":", 1)[0] in ("http", "https", "ws", "wss") and host not in (
            "127.0.0.1",
            "localhost",
        ):
            seen.outside.append(sent.url)

    page.on("console", console)
    page.on("pageerror", lambda error: seen.errors.append(f"uncaught: {error}"))
    page.on("dialog", lambda dialog: (seen.dialogs.append(dialog.message), dialog.dismiss()))
    page.on("request", request)
    return seen
