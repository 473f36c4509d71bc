"""Python's gear as a new user drives gearhorn, for
tests/integration/test_client_libraries.py; usage as gearman_client.php. A
job "throw:MSG" is answered with WORK_EXCEPTION (``sendWorkException``),
anything else "python:<length>:<sha256>" after a WORK_DATA and a WORK_STATUS."""

import hashlib
import json
import sys
import time

import gear


def say(obj):
    print(json.dumps(obj), flush=True)


def connected(cls, host, port):
    client = cls("gearhorn-test-client")
    client.addServer(host, int(port))
    client.waitForServer(30)
    return client


def call(host, port, function, data):
    client = connected(gear.Client, host, port)
    job = gear.Job(function, data.encode(), unique=None)
    started = time.monotonic()
    client.submitJob(job, timeout=60)
    deadline = time.monotonic() + 90
    while not job.complete and time.monotonic() < deadline:
        time.sleep(0.001)
    status = "exception" if job.exception else "failed" if job.failure else "complete"
    say({"status": status, "data": b"".join(job.data).decode("utf-8", "replace"),
         "seconds": time.monotonic() - started})


def background(host, port, function, data):
    client = connected(gear.Client, host, port)
    job = gear.Job(function, data.encode())
    client.submitJob(job, background=True, timeout=60)
    say({"handle": job.handle.decode()})


def worker(host, port, function, count):
    worker = connected(gear.Worker, host, port)
    worker.registerFunction(function)
    for _ in range(int(count)):
        job = worker.getJob()
        data = job.arguments
        say({"length": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        if data.startswith(b"throw:"):
            job.sendWorkException(data[6:])
            continue
        job.sendWorkData(b"working")
        job.sendWorkStatus(1, 1)
        job.sendWorkComplete(f"python:{len(data)}:{hashlib.sha256(data).hexdigest()}".encode())
    worker.shutdown()


if __name__ == "__main__":
    mode, host, port, function, arg = sys.argv[1:]
    {"call": call, "background": background, "worker": worker}[mode](host, port, function, arg)
