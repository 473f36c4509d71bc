"""A small Python helper for producers and consumers.

Producer side: subscribe, unsubscribe and publish through gearhorn's
Gearman functions (with a gearmand and a worker pool running)::

    from gearhorn.client import Producer
    producer = Producer([("127.0.0.1", 4730)])
    producer.subscribe("news", "alice")
    # {'topic': 'news', 'client_id': 'alice', 'subscribers': 1}
    producer.publish("news", "hello", background=True)
    # {'topic': 'news', 'message_id': '...', 'copies': 1, 'background': True}

Consumer side: receive your copies from ``<topic>_<client_id>``::

    from gearhorn.client import Consumer
    with Consumer([("127.0.0.1", 4730)], "news", "alice") as inbox:
        inbox.get(timeout=5)                                   # b'hello'

Any other Gearman worker of ``news_alice`` (``gearman -w -f news_alice``)
receives the same copies; this class is a convenience, not a requirement.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence

import gear

from gearhorn import gearman
from gearhorn.errors import GearhornError
from gearhorn.rules.messages import encode_payload, fanout_job, validate_client_id, validate_topic
from gearhorn.rules.naming import queue_name

Servers = Sequence[tuple[str, int]]


class JobFailed(GearhornError, RuntimeError):
    """A gearhorn job failed; the message is the worker's one-line reason."""


class Producer:
    """Calls ``subscribe_fanout``, ``unsubscribe_fanout`` and ``fanout``."""

    def __init__(self, servers: Servers, timeout: float = 60.0,
                 tls: gearman.TlsFiles | None = None) -> None:
        self.client = gearman.Client(servers, tls=tls)
        self.timeout = timeout

    def subscribe(self, topic: str, client_id: str) -> dict:
        return self._call("subscribe_fanout", {"topic": topic, "client_id": client_id})

    def unsubscribe(self, topic: str, client_id: str) -> dict:
        return self._call("unsubscribe_fanout", {"topic": topic, "client_id": client_id})

    def publish(self, topic: str, payload: object, *, background: bool = False,
                unique: str | None = None, priority: str = "normal",
                delay: float | None = None, deliver_at: float | str | None = None,
                headers: dict[str, str] | None = None, dedup_id: str | None = None) -> dict:
        """Broadcast ``payload`` (str travels as UTF-8, anything else as JSON).

        ``priority`` is high, normal or low; ``delay`` (seconds) or
        ``deliver_at`` (epoch seconds or RFC 3339) hold it back until then;
        ``headers`` reach STOMP subscribers (Gearman ones get the payload);
        ``dedup_id``: the same again on the topic within ``dedup_window`` is
        answered ``"duplicate": true`` with no copies (safe to retry)."""
        job = fanout_job(topic, [encode_payload(payload)], background=background,
                         priority=priority, delay=delay, deliver_at=deliver_at,
                         headers=headers, unique=unique, dedup_id=dedup_id)
        return self._call("fanout", job)

    def presence(self, topic: str, limit: int = 1000, cursor: int = 0) -> dict:
        """Who is subscribed to ``topic`` (``topic_presence``): the count, about
        ``limit`` clients from ``cursor`` on, and the next page's ``cursor``."""
        return self._call("topic_presence", {"topic": topic, "limit": limit, "cursor": cursor})

    def history(self, topic: str, since: int = 0, limit: int = 100,
                epoch: str | None = None) -> dict:
        """``topic``'s messages after offset ``since`` (``topic_history``), with
        its epoch and whether nothing after ``since`` was lost (``recovered``)."""
        job: dict[str, object] = {"topic": topic, "since": since, "limit": limit}
        if epoch is not None:
            job["epoch"] = epoch
        return self._call("topic_history", job)

    def call(self, function: str, data: bytes | str, timeout: float | None = None) -> bytes:
        """Request/reply: run ``function`` as a foreground job and return its
        result; raises JobFailed if it fails, TimeoutError after ``timeout``."""
        body = data.encode() if isinstance(data, str) else data
        outcome = self.client.call(function, body, timeout or self.timeout)
        if outcome.status == "timeout":
            raise TimeoutError(f"{function}: {outcome.reason}")
        if not outcome.ok:
            raise JobFailed(f"{function}: {outcome.reason}")
        return outcome.data

    def _call(self, function: str, job: dict | bytes) -> dict:
        data = job if isinstance(job, bytes) else json.dumps(job).encode()
        outcome = self.client.call(function, data, self.timeout)
        if not outcome.ok:
            raise JobFailed(f"{function}: {outcome.reason}")
        return json.loads(outcome.data)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Consumer:
    """Works ``<topic>_<client_id>``: one call returns one copy."""

    def __init__(self, servers: Servers, topic: str, client_id: str,
                 tls: gearman.TlsFiles | None = None) -> None:
        self.queue = queue_name(validate_topic(topic, allow_prefix=True),
                                validate_client_id(client_id))
        self.worker = gearman.NoDelayWorker(client_id=f"gearhorn-consumer-{client_id}")
        for host, port in servers:
            gearman.add_server(self.worker, host, port, tls)
        self.worker.registerFunction(self.queue)

    def get(self, timeout: float | None = None) -> bytes | None:
        """The next copy (completed at once), or None after ``timeout`` seconds."""
        job = self._next_job(timeout)
        if job is None:
            return None
        job.sendWorkComplete()
        return job.arguments

    def serve(self, handler: Callable[[bytes], object], count: int | None = None) -> None:
        """Call ``handler`` per copy; the job completes only after it returns,
        with what it returned as its answer (bytes, or text as UTF-8: a
        foreground fanout with ``"gather": true`` collects it), and fails
        (WORK_WARNING with the reason, then WORK_FAIL) if it raises."""
        done = 0
        while count is None or done < count:
            job = self._next_job(None)
            try:
                answer = handler(job.arguments)
            except Exception as exc:
                job.sendWorkWarning(str(exc).encode())
                job.sendWorkFail()
            else:
                job.sendWorkComplete(answer.encode() if isinstance(answer, str)
                                     else answer if isinstance(answer, bytes) else b"")
            done += 1

    def _next_job(self, timeout: float | None) -> gear.WorkerJob | None:
        timer = None
        if timeout is not None:
            timer = threading.Timer(timeout, self.worker.stopWaitingForJobs)
            timer.daemon = True
            timer.start()
        try:
            return self.worker.getJob()
        except gear.InterruptedError:
            return None
        finally:
            if timer:
                timer.cancel()

    def close(self) -> None:
        self.worker.shutdown()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
