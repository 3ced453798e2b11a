"""Delays before trying again: doubling to a cap, reset after health."""

from __future__ import annotations

import pytest
from isbre.catalog.backoff import Backoff


def test_delays_double_up_to_the_cap() -> None:
    backoff = Backoff(1.0, 60.0)
    assert [backoff.next() for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]


def test_a_process_that_ran_longer_than_the_cap_starts_again_from_the_first_delay() -> None:
    backoff = Backoff(1.0, 60.0)
    assert [backoff.after_run(0.5) for _ in range(3)] == [1, 2, 4]
    assert backoff.after_run(61.0) == 1
    assert backoff.after_run(0.5) == 2


def test_a_backoff_needs_a_first_delay_within_its_cap() -> None:
    with pytest.raises(ValueError, match="0 < first_s <= most_s"):
        Backoff(2.0, 1.0)
