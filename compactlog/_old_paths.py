"""Module paths the documentation gave users before the modules moved into layer folders.

``import compactlog.subscriber`` (or ``.serde``, ``.aio``, ``.invariants``) keeps working:
the name is an alias of the module's new home, imported on first use. Modules users were
never told to import have no alias, but for ``compactlog.archive.errors``, whose classes
moved into ``compactlog.errors`` with every other exception of the library (code written
against the archive's first release imported them from there). Installed by
``compactlog/__init__.py``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType

OLD_PATHS = {
    "compactlog.aio": "compactlog.engine.aio",
    "compactlog.archive.errors": "compactlog.errors",
    "compactlog.invariants": "compactlog.engine.invariants",
    "compactlog.serde": "compactlog.encoding.serde",
    "compactlog.subscriber": "compactlog.engine.subscriber",
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object, target: object = None) -> ModuleSpec | None:
        if fullname not in OLD_PATHS:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(OLD_PATHS[spec.name])
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the module ran when its new path was imported; the import system has just set its
        # ``__spec__`` to the alias's: give it back its own
        spec = module.__spec__
        assert spec is not None
        module.__spec__ = spec.loader_state


def install() -> None:
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.append(_Alias())
