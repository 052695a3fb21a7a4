"""retry: attempts, waits and which exception the caller sees."""

from __future__ import annotations

import pytest

from tba.retry import Backoff, retry


class Flaky:
    """Raises `errors` in order, then returns "done"."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def run(attempt: Flaky, backoff: Backoff) -> tuple[object, list[float], list[tuple[str, int]]]:
    waits_s: list[float] = []
    logged: list[tuple[str, int]] = []
    try:
        result: object = retry(
            attempt,
            backoff,
            retry_on=lambda exc: isinstance(exc, ConnectionError),
            on_retry=lambda exc, number, wait_s: logged.append((str(exc), number)),
            sleep=waits_s.append,
        )
    except Exception as exc:
        result = exc
    return result, waits_s, logged


def test_waits_double_up_to_the_cap_and_the_first_is_never_cut():
    assert list(Backoff(retries=5, first_s=0.5, max_s=3.0).waits_s()) == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert list(Backoff(retries=3, first_s=1.0, max_s=1.0).waits_s()) == [1.0, 1.0, 1.0]
    assert list(Backoff(retries=2, first_s=60.0, max_s=10.0).waits_s()) == [60.0, 10.0]
    assert list(Backoff(retries=0, first_s=1.0, max_s=1.0).waits_s()) == []


def test_a_retryable_error_is_retried_until_the_attempt_succeeds():
    attempt = Flaky(ConnectionError("a"), ConnectionError("b"))
    result, waits_s, logged = run(attempt, Backoff(retries=5, first_s=1.0, max_s=10.0))
    assert result == "done" and attempt.calls == 3
    assert waits_s == [1.0, 2.0]
    assert logged == [("a", 1), ("b", 2)]


def test_the_last_attempts_error_propagates_once_retries_are_spent():
    last = ConnectionError("c")
    attempt = Flaky(ConnectionError("a"), ConnectionError("b"), last)
    result, waits_s, _ = run(attempt, Backoff(retries=2, first_s=1.0, max_s=10.0))
    assert result is last and attempt.calls == 3
    assert waits_s == [1.0, 2.0]


def test_other_errors_propagate_at_once():
    refused = ValueError("no")
    attempt = Flaky(ConnectionError("a"), refused)
    result, waits_s, _ = run(attempt, Backoff(retries=5, first_s=1.0, max_s=10.0))
    assert result is refused and attempt.calls == 2 and waits_s == [1.0]


@pytest.mark.parametrize("retries", [0, 1])
def test_no_retries_left_means_one_more_attempt_at_most(retries):
    attempt = Flaky(*[ConnectionError(str(i)) for i in range(5)])
    result, waits_s, _ = run(attempt, Backoff(retries=retries, first_s=1.0, max_s=1.0))
    assert isinstance(result, ConnectionError) and attempt.calls == retries + 1
    assert len(waits_s) == retries
