"""The relay's benchmark harness: ``make bench`` or ``python -m bench --help``.

Every figure is reported next to a baseline measured in the same run on the
same machine (the bare SQL drain, the raw broker clients, the bare commit
rate), because absolute rates on a shared machine say little.
"""
