"""The ledger's data pipeline on Spark: pure DataFrame transforms (``transforms``),
the report (``report``) and a thin entry point (``job``).

Nothing here imports gevent or gear: the package ships to a cluster with
``--py-files`` as it is (docs/pipeline.rst).
"""
