"""GET /ui: the console's page and its assets, shipped in the package; no build step, no CDN.

The page and its scripts hold no catalog data: they are served to anyone, like the probes.
Everything the page shows it fetches from the API with the caller's own token, so a reader
sees exactly what the API lets it see. The Content-Security-Policy allows scripts, styles and
connections to this origin only, and no inline script or style.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, Depends
from fastapi.responses import RedirectResponse, Response
from isbre.rest.access import PUBLIC

PREFIX = "/ui"

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def _assets() -> dict[str, tuple[bytes, str]]:
    """Every file the console ships, by name: read once, so no request can name another file."""
    static = files("isbre.console") / "static"
    return {
        entry.name: (entry.read_bytes(), _TYPES[suffix])
        for entry in static.iterdir()
        if (suffix := "." + entry.name.rpartition(".")[2]) in _TYPES
    }


def console_router() -> APIRouter:
    assets = _assets()
    router = APIRouter(prefix=PREFIX, dependencies=[Depends(PUBLIC)], include_in_schema=False)

    @router.get("")
    def console_root() -> Response:
        return RedirectResponse(f"{PREFIX}/", status_code=308)

    @router.get("/")
    def console_page() -> Response:
        return asset("index.html")

    @router.get("/{name}")
    def asset(name: str) -> Response:
        found = assets.get(name)
        if found is None:
            return Response("Not found", status_code=404, media_type="text/plain", headers=_HEADERS)
        body, media_type = found
        return Response(body, media_type=media_type, headers=_HEADERS)

    return router
