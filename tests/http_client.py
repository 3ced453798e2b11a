"""One HTTP client per test process, for the requests the tests send by hand.

`httpx.get()` and its siblings build a client for every request, and building one loads the CA
bundle (40-50 ms here) although every test speaks plain HTTP on loopback. This client is built
once and, like those functions, keeps no connection open after a request and sets no limit on
how many are open at once: a test that counts a server's connections, holds many streams, or
kills a server and starts another on its port sees exactly what it sent.
"""

from __future__ import annotations

import httpx

http = httpx.Client(limits=httpx.Limits(max_connections=None, max_keepalive_connections=0))
