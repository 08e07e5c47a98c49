"""``python -m compactlog.cleaner``: the same as the ``compactlog-cleaner`` script.

Guarded so that importing the module (a package walk, a documentation tool) starts nothing.
"""

from .main import main

if __name__ == "__main__":
    main()
