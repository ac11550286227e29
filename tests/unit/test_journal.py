"""The shared journal's async path: order per journal, all records land, fsync off the event loop."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentinfra._journal import FSYNC_WORKERS, Journal
from agentinfra.errors import AgentInfraError


def _records(path: Path) -> list[tuple[int, str, dict[str, object]]]:
    return [(e.seq, e.type, e.data) for e in Journal.read(path)]


def test_concurrent_async_appends_keep_order_per_journal_and_all_land(tmp_path: Path) -> None:
    paths = [tmp_path / f"j{n}.jsonl" for n in range(6)]  # more journals than pool threads
    journals = [Journal.open(path) for path in paths]

    async def go() -> None:
        await asyncio.gather(
            *(
                journal.append_async("e", {"journal": n, "i": i})
                for i in range(40)
                for n, journal in enumerate(journals)
            )
        )

    asyncio.run(go())
    for journal in journals:
        journal.close()
    assert len(journals) > FSYNC_WORKERS
    for n, path in enumerate(paths):
        expected = [(i, "e", {"journal": n, "i": i}) for i in range(40)]
        assert _records(path) == expected
        assert [(e.seq, e.type, e.data) for e in journals[n].events] == expected


def test_async_and_sync_appends_share_one_sequence(tmp_path: Path) -> None:
    journal = Journal.open(tmp_path / "j.jsonl")

    async def go() -> None:
        first = asyncio.ensure_future(journal.append_async("async", {"i": 0}))
        await first
        journal.append("sync", {"i": 1})
        await asyncio.gather(
            journal.append_async("async", {"i": 2}), journal.append_async("async", {"i": 3})
        )

    asyncio.run(go())
    journal.append("sync", {"i": 4})  # outside any event loop, after one has ended
    asyncio.run(journal.append_async("async", {"i": 5}))  # a second event loop
    journal.close()
    assert _records(tmp_path / "j.jsonl") == [
        (0, "async", {"i": 0}),
        (1, "sync", {"i": 1}),
        (2, "async", {"i": 2}),
        (3, "async", {"i": 3}),
        (4, "sync", {"i": 4}),
        (5, "async", {"i": 5}),
    ]


def test_fsync_runs_in_the_executor_and_the_event_loop_keeps_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsync_threads: list[str] = []
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        fsync_threads.append(threading.current_thread().name)
        time.sleep(0.05)
        real_fsync(fd)

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-pool")
    journal = Journal.open(tmp_path / "j.jsonl", executor=pool)
    monkeypatch.setattr(os, "fsync", slow_fsync)
    ticks: list[float] = []

    async def ticker(stop: asyncio.Event) -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            await asyncio.sleep(0.005)

    async def go() -> None:
        stop = asyncio.Event()
        ticking = asyncio.create_task(ticker(stop))
        await asyncio.gather(*(journal.append_async("e", {"i": i}) for i in range(4)))
        stop.set()
        await ticking

    asyncio.run(go())
    monkeypatch.undo()
    journal.close()
    pool.shutdown()
    assert len(fsync_threads) == 4
    assert all(name.startswith("test-pool") for name in fsync_threads)
    assert len(ticks) >= 10  # 4 fsyncs of 50 ms: the loop ticked meanwhile every 5 ms
    assert [e.data["i"] for e in Journal.read(tmp_path / "j.jsonl")] == [0, 1, 2, 3]


def test_a_failed_async_append_acknowledges_nothing_and_the_journal_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = Journal.open(tmp_path / "j.jsonl")
    asyncio.run(journal.append_async("kept"))

    def no_space(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", no_space)
    with pytest.raises(AgentInfraError, match="No space left on device"):
        asyncio.run(journal.append_async("lost"))
    monkeypatch.undo()
    assert [e.type for e in journal.events] == ["kept"]
    asyncio.run(journal.append_async("after"))
    journal.close()
    assert _records(tmp_path / "j.jsonl") == [(0, "kept", {}), (1, "after", {})]


def test_a_cancelled_append_holds_the_queue_until_its_write_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fsync = os.fsync
    started = threading.Event()

    def slow_fsync(fd: int) -> None:
        started.set()
        time.sleep(0.1)
        real_fsync(fd)

    journal = Journal.open(tmp_path / "j.jsonl")
    monkeypatch.setattr(os, "fsync", slow_fsync)

    async def go() -> None:
        first = asyncio.create_task(journal.append_async("first"))
        second = asyncio.create_task(journal.append_async("second"))
        while not started.is_set():
            await asyncio.sleep(0.001)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await second

    asyncio.run(go())
    monkeypatch.undo()
    journal.close()
    # the cancelled write was under way: it landed, and the next one after it
    assert _records(tmp_path / "j.jsonl") == [(0, "first", {}), (1, "second", {})]


def test_a_write_queued_behind_close_fails_instead_of_using_a_reused_descriptor(
    tmp_path: Path,
) -> None:
    gate = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        journal = Journal.open(tmp_path / "j.jsonl", executor=pool)
        pool.submit(gate.wait)  # the pool's one thread is busy: the append waits in its queue

        async def go() -> str:
            append = asyncio.create_task(journal.append_async("late"))
            await asyncio.sleep(0.05)
            journal.close()
            other = os.open(tmp_path / "other", os.O_RDWR | os.O_CREAT)  # may take the old number
            gate.set()
            try:
                with pytest.raises(AgentInfraError) as caught:
                    await append
            finally:
                os.close(other)
            return str(caught.value)

        message = asyncio.run(go())
    assert message == f"journal {tmp_path / 'j.jsonl'} is closed; nothing was written"
    assert (tmp_path / "other").read_bytes() == b""
    assert Journal.read(tmp_path / "j.jsonl") == []


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # 3.12 warns about fork with threads
def test_a_forked_child_gets_a_pool_of_its_own(tmp_path: Path) -> None:
    parent = Journal.open(tmp_path / "parent.jsonl")
    asyncio.run(parent.append_async("started"))  # the shared pool now has a thread
    pid = os.fork()
    if pid == 0:  # the child: its copy of the pool has no threads; an append must still land
        code = 1
        try:
            child = Journal.open(tmp_path / "child.jsonl")
            asyncio.run(asyncio.wait_for(child.append_async("in_child"), timeout=10))
            child.close()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    parent.close()
    assert done[0] == pid
    assert os.waitstatus_to_exitcode(done[1]) == 0
    assert _records(tmp_path / "child.jsonl") == [(0, "in_child", {})]
