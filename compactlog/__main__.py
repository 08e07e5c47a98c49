"""``python -m compactlog``: the operator CLI, the same as the ``compactlog`` script.

Guarded so that importing the module (a package walk, a documentation tool) starts nothing.
"""

from .cli.main import main

if __name__ == "__main__":
    main()
