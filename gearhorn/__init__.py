"""gearhorn: broadcast (fanout) for Gearman."""

__version__ = "0.1.0"
