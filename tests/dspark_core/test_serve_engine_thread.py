"""`serve` confines the engine to one thread: the Driver's loop runs on the executor that built the engine. With
libgomp, torch's parallel ops on a second thread cost 1.3-1.4x what they cost on the thread that loaded the model
(serving/driver.py), so a loop on a thread of its own made `serve` slower than `generate`."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

from dspark_core.config import EngineConfig
from dspark_core.engine import Engine
from dspark_core.serving.driver import Chunk, Driver
from dspark_core.verification.sampling import SamplingParams


def test_the_engine_loop_runs_on_the_thread_that_built_the_engine() -> None:
    worker = ThreadPoolExecutor(1)
    built_on = worker.submit(threading.get_ident).result()
    engine = worker.submit(Engine, EngineConfig(device="cpu")).result()
    stepped_on: set[int] = set()
    step = engine.step

    def spy():  # noqa: ANN202 - Engine.step's updates
        stepped_on.add(threading.get_ident())
        return step()

    engine.step = spy  # type: ignore[method-assign]

    async def serve_one() -> list[Chunk]:
        driver = Driver(engine, asyncio.get_running_loop(), worker)
        driver.start()
        assert driver.running
        out = driver.submit("r0", [1, 2, 3], SamplingParams(max_new_tokens=4, ignore_eos=True), [])
        chunks = [await asyncio.wait_for(out.get(), 60)]
        while chunks[-1].finish_reason is None and chunks[-1].error is None:
            chunks.append(await asyncio.wait_for(out.get(), 60))
        await asyncio.to_thread(driver.stop, 30)
        assert not driver.running
        return chunks

    chunks = asyncio.run(serve_one())
    assert chunks[-1].finish_reason == "length" and chunks[-1].tokens == 4
    assert stepped_on == {built_on}
    assert worker.submit(lambda: 1).result() == 1  # the executor stays its owner's to shut down
    worker.shutdown()
