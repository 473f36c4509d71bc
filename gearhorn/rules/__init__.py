"""Pure rules, no I/O: what a job's payload may hold (``messages``), how
queues, copies and ids are named (``naming``), a subscription's limits
(``limits``) and how a bounded queue is judged (``retention``), which topics
keep a history (``historypolicy``), a fanout's options (``fanoutoptions``),
STOMP logins and permissions (``auth``), and the ledger's events (``events``).
"""
