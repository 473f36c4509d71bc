"""Runs N worker processes: restarts the ones that die, drains on SIGTERM.

Signals (to the supervisor; Ctrl-C's SIGINT counts the same):
- the first SIGTERM asks every worker to finish the job in hand and exit;
- a second one kills them at once (gearmand hands their jobs to others).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess

from gearhorn.config import Config

log = logging.getLogger(__name__)

# A worker that dies sooner than this after starting is restarted with a
# growing delay, so a broken setup does not fork in a tight loop.
_STABLE_AFTER = 5.0
_MAX_RESTART_DELAY = 10.0
# The supervisor sleeps until a worker exits, a signal comes or a delayed
# restart is due; this bounds the sleep, in case all three were missed.
_LONGEST_WAIT = 5.0


def run_worker(config: Config) -> None:
    """Body of one worker process."""
    from gearhorn.runtime.logs import setup_logging
    from gearhorn.worker.process import WorkerProcess

    setup_logging(config.log_level)
    worker = WorkerProcess(config)
    stops = 0

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stops
        stops += 1
        if stops > 1:
            os._exit(128 + signum)
        worker.drain()

    signal.signal(signal.SIGTERM, on_signal)
    # Ctrl-C reaches the whole process group; the supervisor decides for us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker.run()


class Pool:
    """Keeps ``config.processes`` workers running."""

    def __init__(self, config: Config,
                 target: Callable[[Config], None] = run_worker) -> None:
        self.config = config
        self.target = target
        self._ctx = multiprocessing.get_context("spawn")
        self.children: list[BaseProcess | None] = [None] * config.processes
        self._started = [0.0] * config.processes
        self._failures = [0] * config.processes
        self._stops = 0
        self.restarts = 0

    def run(self) -> int:
        """Supervise until stopped by a signal; returns the exit code."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        # A signal writes a byte here, so it ends the wait below at once.
        wakeup, wakeup_w = os.pipe()
        for fd in (wakeup, wakeup_w):
            os.set_blocking(fd, False)
        previous_fd = signal.set_wakeup_fd(wakeup_w)
        try:
            for slot in range(len(self.children)):
                self._start(slot)
            while not self._stops:
                restart_in = self._reap_and_restart()
                # Woken by a worker's exit or a signal, not by a clock: polling
                # every 0.2 s woke the idle supervisor five times a second.
                living = [c.sentinel for c in self.children if c is not None and c.is_alive()]
                multiprocessing.connection.wait([*living, wakeup], min(restart_in, _LONGEST_WAIT))
                with contextlib.suppress(BlockingIOError):
                    os.read(wakeup, 512)
            return self._drain()
        finally:
            signal.set_wakeup_fd(previous_fd)
            os.close(wakeup)
            os.close(wakeup_w)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: object) -> None:
        self._stops += 1
        if self._stops == 1:
            log.info("stopping: workers finish their jobs (signal again to stop now)")
            self._signal_children(signal.SIGTERM)
        else:
            log.info("stopping now")
            self._signal_children(signal.SIGKILL)

    def _signal_children(self, signum: int) -> None:
        for child in self.children:
            if child is not None and child.pid and child.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signum)

    def _start(self, slot: int) -> None:
        child = self._ctx.Process(target=self.target, args=(self.config,),
                                  name=f"gearhorn-worker-{slot}", daemon=False)
        child.start()
        self.children[slot] = child
        self._started[slot] = time.monotonic()
        log.info("worker %d started (pid %d)", slot, child.pid)

    def _reap_and_restart(self) -> float:
        """Restart the workers that died; returns the seconds until a delayed
        restart is due (``_LONGEST_WAIT`` when none is)."""
        now = time.monotonic()
        restart_in = _LONGEST_WAIT
        for slot, child in enumerate(self.children):
            if child is None or child.is_alive():
                continue
            if now - self._started[slot] >= _STABLE_AFTER:
                self._failures[slot] = 0
            delay = min(_MAX_RESTART_DELAY, 0.5 * (2 ** self._failures[slot]) - 0.5)
            if now - self._started[slot] < delay:
                restart_in = min(restart_in, delay - (now - self._started[slot]))
                continue
            log.warning("worker %d (pid %d) exited with %s; restarting", slot, child.pid,
                        child.exitcode)
            self._failures[slot] += 1
            self.restarts += 1
            child.close()
            self._start(slot)
        return restart_in

    def _drain(self) -> int:
        for child in self.children:
            if child is not None:
                child.join()
        log.info("all workers stopped")
        return 0
