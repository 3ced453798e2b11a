"""The roles a principal may hold, weakest first: each may do what the ones before it may."""

from __future__ import annotations

from typing import Literal, get_args

Role = Literal["reader", "writer", "admin"]
ROLES: tuple[Role, ...] = get_args(Role)
RANK: dict[Role, int] = {role: rank for rank, role in enumerate(ROLES)}
