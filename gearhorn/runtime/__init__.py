"""What every long-running gearhorn process shares: threads that repeat and
stop (``background``), logging (``logs``), the garbage collector's settings
(``collector``), the gevent processes' entry (``entry``), and the ports they
listen on (``ports``).
"""
