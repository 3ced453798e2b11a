"""A scan plan request's filter, bounded and balanced before it is parsed.

A filter is the spec's expression JSON, a tree. Its size is the client's to choose, and what the
server does with it (parse it, bind it, evaluate it against every manifest and file) grows with
it: a million-value `in` took 16 s of CPU. So a filter of more than `plan_max_filter_terms`
predicates and values is refused (400) before anything else is done with it. Java's and
PyIceberg's clients write `a and b and c ...` as a chain nested as deep as it is long, deeper than
the parser's recursion allows at a few hundred terms: a chain of one operator is rebuilt as a
balanced tree of the same meaning (`and` and `or` are associative), and what is still nested past
`MAX_DEPTH` is refused.
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 64
_CHAINED = ("and", "or")


class FilterTooLargeError(ValueError):
    """A plan request's filter past the server's bounds."""


def _chain(node: dict[str, Any]) -> list[Any]:
    """The operands of the chain of `node`'s operator that `node` heads, in order."""
    kind = node["type"]
    found: list[Any] = []
    pending: list[Any] = [node]
    while pending:
        each = pending.pop()
        if isinstance(each, dict) and each.get("type") == kind and "left" in each and "right" in each:
            pending += [each["right"], each["left"]]
        else:
            found.append(each)
    return found


def _balanced(kind: str, operands: list[Any]) -> Any:
    if len(operands) == 1:
        return operands[0]
    middle = len(operands) // 2
    left, right = _balanced(kind, operands[:middle]), _balanced(kind, operands[middle:])
    return {"type": kind, "left": left, "right": right}


def bounded_filter(raw: Any, max_terms: int) -> Any:
    """`raw`, a filter's JSON, with its chains balanced; FilterTooLargeError when it holds more than
    `max_terms` predicates and values, or is nested deeper than MAX_DEPTH once balanced. What is
    not an expression is left for the parser to refuse."""
    terms = 0
    root: dict[str, Any] = {"filter": raw}
    pending: list[tuple[Any, Any, int]] = [(root, "filter", 0)]  # (parent, key in it, depth)
    while pending:
        parent, key, depth = pending.pop()
        node = parent[key]
        if isinstance(node, dict) and node.get("type") in ("true", "false") and len(node) == 1:
            node = parent[key] = node["type"] == "true"  # the spec's deprecated spelling of a constant
        if not isinstance(node, dict):
            terms += 1  # `true`, `false`, or what the parser will refuse
            continue
        if depth > MAX_DEPTH:
            raise FilterTooLargeError(
                f"Invalid filter: nested deeper than {MAX_DEPTH} levels (chains of and/or are not counted)"
            )
        kind = node.get("type")
        if kind in _CHAINED and "left" in node and "right" in node:
            node = parent[key] = _balanced(str(kind), _chain(node))
        if isinstance(node, dict) and node.get("type") in (*_CHAINED, "not"):
            children = [name for name in ("left", "right", "child") if name in node]
            pending += [(node, name, depth + 1) for name in children]
            continue
        values = node.get("values") if isinstance(node, dict) else None
        terms += 1 + (len(values) if isinstance(values, list) else 0)
        if terms > max_terms:
            break
    if terms > max_terms:
        raise FilterTooLargeError(
            f"Invalid filter: more than {max_terms} predicates and values (plan_max_filter_terms)"
        )
    return root["filter"]
