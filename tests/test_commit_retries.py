"""The commit loop's retries (catalog/table_commit.py): a commit that lost its pointer swap is
staged again, and one that keeps losing is refused with a conflict, not retried forever."""

from __future__ import annotations

import pytest
from isbre.catalog import table_commit
from isbre.catalog.pointer_swap import Stale
from isbre.catalog.table_commit import MAX_COMMIT_ATTEMPTS, retrying
from pyiceberg.exceptions import CommitFailedException


@pytest.fixture(autouse=True)
def _short_delays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table_commit, "COMMIT_RETRY_FIRST_S", 0.0001)
    monkeypatch.setattr(table_commit, "COMMIT_RETRY_MOST_S", 0.001)


def test_a_commit_that_lost_the_swap_is_staged_again_until_it_lands() -> None:
    attempts: list[int] = []

    def attempt() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise Stale
        return "landed"

    assert retrying(attempt) == "landed"
    assert len(attempts) == 3


def test_a_commit_that_keeps_losing_is_refused_as_a_conflict_after_the_last_attempt() -> None:
    attempts: list[int] = []

    def attempt() -> None:
        attempts.append(1)
        raise Stale

    with pytest.raises(CommitFailedException, match=f"after {MAX_COMMIT_ATTEMPTS} attempts"):
        retrying(attempt)
    assert len(attempts) == MAX_COMMIT_ATTEMPTS


def test_any_other_failure_is_answered_at_once() -> None:
    attempts: list[int] = []

    def attempt() -> None:
        attempts.append(1)
        raise CommitFailedException("Requirement failed: branch main has changed")

    with pytest.raises(CommitFailedException, match="branch main"):
        retrying(attempt)
    assert len(attempts) == 1
