"""The operator's own tasks (tasks.py): one per key, a rerun for an ask that came while one ran, stop."""

from __future__ import annotations

import asyncio

from rbak_operator.runtime import tasks


def test_one_task_per_key_and_one_rerun_for_asks_while_it_ran():
    runs: list[int] = []

    async def scenario() -> None:
        gate = asyncio.Event()

        async def work() -> None:
            runs.append(len(runs))
            if len(runs) == 1:
                await gate.wait()

        tasks.ensure(("backup", "ns", "a"), work)
        await asyncio.sleep(0)
        tasks.ensure(("backup", "ns", "a"), work)  # asked twice while the first runs: one rerun
        tasks.ensure(("backup", "ns", "a"), work)
        assert tasks.running(("backup", "ns", "a")) and runs == [0]
        gate.set()
        for _ in range(20):
            await asyncio.sleep(0)
        assert runs == [0, 1] and not tasks.running(("backup", "ns", "a"))
        await tasks.stop_all()

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_stop_all_ends_the_loops_and_starts_nothing_after():
    ended: list[str] = []

    async def scenario() -> None:
        async def loop(name: str) -> None:
            await tasks.stopping().wait()
            ended.append(name)

        tasks.ensure(("backup", "ns", "x"), lambda: loop("x"))
        tasks.ensure(("restore", "ns", "y"), lambda: loop("y"))
        await asyncio.sleep(0)
        stopping = tasks.stopping()
        stop = asyncio.ensure_future(tasks.stop_all(timeout=5))
        await asyncio.sleep(0)
        assert stopping.is_set()
        tasks.ensure(("backup", "ns", "z"), lambda: loop("z"))  # during shutdown: refused
        await stop
        assert sorted(ended) == ["x", "y"] and not tasks.running(("backup", "ns", "z"))

    asyncio.run(asyncio.wait_for(scenario(), 10))
