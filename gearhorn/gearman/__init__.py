"""Talking Gearman: packets, connections, pipelined submission, admin, workers.

Why not ``gear.Client``: it waits for JOB_CREATED before sending the next
job and keeps every background job in ``related_jobs`` forever. Here a batch
of SUBMIT_JOB packets goes out in one write and the JOB_CREATED replies are
read in order (gearmand answers a connection's requests in order), with no
per-job state kept after the call. Every socket has TCP_NODELAY.

=================  =====================================================
``packets``        packet types, encoding and decoding, errors; pure
``connection``     one connection to a gearmand (TCP_NODELAY; TLS when given files)
``client``         submitting to several servers: batches, results, failover
``admin``          the text admin protocol (``status``, ``drop function``)
``worker``         taking jobs: gear's worker, the bridge's grabbing worker,
                   the fanout workers' batched source of jobs
=================  =====================================================
"""

from gearhorn.gearman.admin import (
    FunctionStatus,
    admin,
    client_ids,
    drop_function,
    status,
    status_rows,
    totals,
)
from gearhorn.gearman.client import Client, Placed, call_unique, wait_for_results
from gearhorn.gearman.connection import (
    Connection,
    TlsFiles,
    add_server,
    connect,
)
from gearhorn.gearman.holder import Holder
from gearhorn.gearman.packets import (
    MAX_PACKET,
    REQ,
    RES,
    Answers,
    Copy,
    GearmanError,
    Outcome,
    P,
    Packet,
    PacketError,
    PacketReader,
    PartialSubmit,
    Unavailable,
    encode,
)
from gearhorn.gearman.tcp import CONNECT_TIMEOUT, keepalive_options
from gearhorn.gearman.worker import GrabbedJob, JobSource, NoDelayWorker, WorkerConnection

__all__ = [
    "add_server", "admin", "Answers", "call_unique", "Client", "client_ids", "connect",
    "CONNECT_TIMEOUT", "Connection", "Copy", "drop_function", "encode", "FunctionStatus",
    "GearmanError", "GrabbedJob", "Holder", "JobSource", "keepalive_options", "MAX_PACKET",
    "NoDelayWorker", "Outcome", "P", "Packet", "PacketError", "PacketReader", "PartialSubmit",
    "Placed", "REQ", "RES", "status", "status_rows", "TlsFiles", "totals", "Unavailable",
    "wait_for_results", "WorkerConnection",
]
