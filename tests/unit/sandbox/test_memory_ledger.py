"""The host's memory ledger: grants in turn, waits, refuses what can never fit, survives its holders' deaths."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from agentinfra.sandbox import (
    MachineMemory,
    MemoryLedger,
    MemoryTooLargeError,
    MemoryWaitTimeoutError,
)

GIB = 1 << 30
MIB = 1 << 20


def ledger(folder: Path, available: int = 10 * GIB, total: int = 20 * GIB) -> MemoryLedger:
    """A ledger over a fake machine: 20 GiB, headroom 1 GiB (5%)."""
    return MemoryLedger(folder, machine=lambda: MachineMemory(total, available))


def test_reservations_sum_to_the_idle_sample_less_headroom(tmp_path: Path) -> None:
    book = ledger(tmp_path)
    first = book.reserve(5 * GIB, label="a", max_wait_s=0)
    second = book.reserve(4 * GIB, label="b", max_wait_s=0)  # 9 GiB of the 10 less 1 GiB headroom
    view = book.view()
    assert (view.held_bytes, view.capacity_bytes, view.waiting) == (9 * GIB, 9 * GIB, 0)
    with pytest.raises(MemoryWaitTimeoutError) as waited:
        book.reserve(MIB, label="c", max_wait_s=0.3)
    assert "9.0 GiB held by 2 gradings" in str(waited.value)
    first.release()
    second.release()
    assert book.view().held_bytes == 0
    assert not list(tmp_path.glob("r-*"))  # a timed-out wait leaves no entry behind


def test_a_request_that_never_fits_is_refused_at_once_naming_the_machine(tmp_path: Path) -> None:
    book = ledger(tmp_path, available=6 * GIB, total=8 * GIB)  # headroom 512 MiB
    started = time.monotonic()
    with pytest.raises(MemoryTooLargeError) as refused:
        book.reserve(6 * GIB, label="big", max_wait_s=60)
    assert time.monotonic() - started < 5
    assert refused.value.view.most_bytes == 6 * GIB - 512 * MIB
    assert "MemAvailable 6.0 GiB of MemTotal 8.0 GiB" in refused.value.view.describe()


def test_a_grading_that_does_not_fit_now_waits_its_turn(tmp_path: Path) -> None:
    book = ledger(tmp_path)
    held = book.reserve(6 * GIB, label="first", max_wait_s=0)
    order: list[str] = []
    told = threading.Event()

    def second() -> None:
        got = book.reserve(6 * GIB, label="second", max_wait_s=30, on_wait=lambda _view: told.set())
        order.append("second granted")
        got.release()

    thread = threading.Thread(target=second)
    thread.start()
    assert told.wait(10)  # the waiter says so, once it waits
    assert book.view().waiting == 1
    time.sleep(0.5)
    assert order == []
    order.append("first released")
    held.release()
    thread.join(10)
    assert order == ["first released", "second granted"]


def test_first_come_first_served_a_small_request_does_not_pass_an_earlier_large_one(
    tmp_path: Path,
) -> None:
    book = ledger(tmp_path)
    held = book.reserve(5 * GIB, label="running", max_wait_s=0)
    granted: list[str] = []
    big_waits = threading.Event()

    def big() -> None:
        book.reserve(
            8 * GIB, label="big", max_wait_s=30, on_wait=lambda _v: big_waits.set()
        ).release()
        granted.append("big")

    thread = threading.Thread(target=big)
    thread.start()
    assert big_waits.wait(10)
    with pytest.raises(MemoryWaitTimeoutError):  # 1 GiB would fit beside 5, but big came first
        book.reserve(GIB, label="small", max_wait_s=0.5)
    held.release()
    thread.join(10)
    assert granted == ["big"]


def test_growing_never_waits_and_shrinking_always_succeeds(tmp_path: Path) -> None:
    book = ledger(tmp_path)
    one = book.reserve(2 * GIB, label="one", max_wait_s=0)
    other = book.reserve(4 * GIB, label="other", max_wait_s=0)
    assert one.grow(5 * GIB)  # 5 + 4 <= 9
    assert not one.grow(6 * GIB)  # 6 + 4 > 9: answered at once
    assert book.view().held_bytes == 9 * GIB
    assert one.grow(GIB)
    with pytest.raises(MemoryTooLargeError):
        one.grow(30 * GIB)
    one.release()
    other.release()


def _hold_and_wait(folder: str, ready: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    ledger(Path(folder)).reserve(8 * GIB, label="doomed", max_wait_s=0)
    ready.set()
    time.sleep(60)


def test_a_dead_holders_reservation_is_released_by_the_next_decision(tmp_path: Path) -> None:
    ready = multiprocessing.get_context("fork").Event()
    holder = multiprocessing.get_context("fork").Process(
        target=_hold_and_wait, args=(str(tmp_path), ready)
    )
    holder.start()
    try:
        assert ready.wait(20)
        book = ledger(tmp_path)
        assert book.view().held_bytes == 8 * GIB
        os.kill(holder.pid or 0, signal.SIGKILL)  # no chance to release anything
        holder.join(10)
        assert book.view().held_bytes == 0
        book.reserve(8 * GIB, label="after", max_wait_s=0).release()
        assert not list(tmp_path.glob("r-*"))
    finally:
        holder.kill()


def test_other_load_on_the_machine_lowers_what_gradings_may_hold(tmp_path: Path) -> None:
    machine = {"available": 10 * GIB}
    book = MemoryLedger(tmp_path, machine=lambda: MachineMemory(20 * GIB, machine["available"]))
    held = book.reserve(4 * GIB, label="a", max_wait_s=0)  # idle sample: 10 GiB
    machine["available"] = 3 * GIB  # something else took 7 GiB; the 4 GiB are not touched yet
    view = book.view()
    assert view.capacity_bytes == 3 * GIB + 4 * GIB - GIB
    with pytest.raises(MemoryWaitTimeoutError):
        book.reserve(3 * GIB, label="b", max_wait_s=0.3)
    held.release()


def test_a_reservation_not_yet_in_use_does_not_make_the_machine_look_larger(tmp_path: Path) -> None:
    """A held grading that has not grown yet is still in MemAvailable: counting it back in as well
    once said 29.9 GiB on a 23.5 GiB machine. What one grading could get stays within MemTotal."""
    book = ledger(tmp_path, available=18 * GIB, total=20 * GIB)  # headroom 1 GiB
    held = book.reserve(10 * GIB, label="not grown yet", max_wait_s=0)  # MemAvailable still 18 GiB
    view = book.view()
    assert view.most_bytes == 20 * GIB - GIB  # not 18 + 10 - 1
    assert view.capacity_bytes == 18 * GIB - GIB
    held.release()
