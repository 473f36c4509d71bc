"""The ``gearhorn`` command: its options (``main``), what each command does
(``commands``), ``gearhorn up`` (``up``) and ``gearhorn status`` (``status``).
"""
