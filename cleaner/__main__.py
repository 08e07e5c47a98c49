"""``python -m compactlog.cleaner``: the same as the ``compactlog-cleaner`` script."""

from .main import main

main()
