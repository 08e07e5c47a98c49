"""What the service checks about the directories it was given, at ``--check`` and at start.

Parsing (``config.py``) checks values; this looks at the disk. A root is a directory of
logs: one that is itself a log is a configuration error (the service would clean nothing
and put its state and lock files inside the log), and so is a state file inside a log. A
root that holds no log is an error for ``--once`` (one round over nothing is a wrong path,
not a success) and a warning for a service, which picks up logs created later. Every
``[[override]]`` is checked against each log it matches (``overrides.check_rules``).
"""

from __future__ import annotations

import os

from compactlog.errors import CompactLogError
from compactlog.storage import filenames
from compactlog.storage.state_files import read_meta

from .config import CleanerConfigError, ServiceConfig
from .discovery import discover
from .overrides import check_rules


def check(config: ServiceConfig, *, once: bool) -> list[str]:
    """Raise :class:`CleanerConfigError` for what makes the service unusable; return the
    warnings (roots holding no log yet)."""
    warnings = []
    for root in config.roots:
        if os.path.exists(os.path.join(root, filenames.META)):
            raise CleanerConfigError(
                "roots",
                f"{root} is itself a log (it has a meta file), not a directory of logs: "
                f"give its parent as the root, or name the log with --log {root} "
                '(logs = ["..."] in the file)',
                source=config.source,
            )
        if root and not discover((root,), ()):
            problem = f"{root} holds no log ({_contents(root)})"
            if once:
                raise CleanerConfigError("roots", problem, source=config.source)
            warnings.append(f"{problem}; logs created there later are picked up")
    if config.state_file or config.roots:
        state_dir = os.path.dirname(config.state_path)
        if os.path.exists(os.path.join(state_dir, filenames.META)):
            raise CleanerConfigError(
                "state_file",
                f"{config.state_path} would be inside the log {state_dir}: the service "
                "never writes into a log directory",
                source=config.source,
            )
    refs = discover(config.roots, config.logs)
    stored = {}
    for ref in refs:
        try:
            stored[ref.path] = read_meta(ref.path).config
        except (CompactLogError, OSError, ValueError, TypeError, KeyError):
            continue  # reported by the rounds, as every unreadable log is
    check_rules(config, refs, stored)
    return warnings


def _contents(root: str) -> str:
    """What a root holds instead of logs, for the error."""
    try:
        names = sorted(os.listdir(root))
    except OSError as error:
        return f"cannot list it: {error.strerror or error}"
    if not names:
        return "it is empty"
    shown = ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
    return f"{len(names)} entries, none a log directory with a meta file: {shown}"
