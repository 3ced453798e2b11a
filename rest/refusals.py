"""What a command refuses to do, said in one line: shared by the command line and the server's
start, which refuses a port in use or a state directory another server holds."""

from __future__ import annotations


class RefusedError(Exception):
    """What the user asked for cannot be done; the message says why."""

    exit_code = 2
