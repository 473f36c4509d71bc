"""The ledger's data pipeline on Spark: pure DataFrame transforms
(``transforms`` for the report, ``live`` for the live audit), the report
(``report``, ``job``) and the live audit (``audit``, judged by ``verdicts``).

Nothing here imports gevent or gear, and the transforms use no Python UDFs:
the package ships to a cluster with ``--py-files`` as it is
(docs/pipeline.rst).
"""
