"""Records every file-changing call of a workload, in process, at the ``os``/``mmap`` level.

Why this level: the library's I/O seam (``fsio.FileSystem``) does not see everything that
changes a log (the head's mapped stores, the exclusive writer's mapped tail, ``makedirs``,
snapshots' links, repair's header rewrite), and a simulator that trusts the seam tests less
than users run. So the recorder patches the ``os`` functions that change files (and every
``from os import name`` binding of them in ``compactlog`` modules, e.g. ``single.pwrite``)
``mmap.mmap.flush``, and the built-in ``open`` for writing as ``compactlog`` modules see
it. Each call under the workload's root directory is one *event*:

1. the real call runs (the recorder observes, it never emulates: the workload runs on a
   real directory);
2. the whole tree under the root is read back (workloads are KiBs), so stores into shared
   mappings between two system calls (``.lock``'s head, the mapped tail, the precommit
   file), which make no call of their own, show up at the next event;
3. the event keeps that tree, which file node or directory the call made durable (``fsync``,
   ``fdatasync``, ``msync``) and what the workload had acknowledged before the call.

Nodes are inodes: a node keeps its identity across renames and links (a number reused by
the file system for a new file after the old one was freed is a new node), so crash-state
builders (``models.py``) can say "the content at its last fsync" and "the entries of this
directory at its last fsync".
"""

from __future__ import annotations

import builtins
import mmap
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

ROOT_NODE = 0
SYNC_CALLS = frozenset({"fsync", "fdatasync", "msync"})

# os functions that change files, patched for the recording; open only counts with these flags
PATCHED = (
    "open",
    "write",
    "pwrite",
    "pwritev",
    "ftruncate",
    "truncate",
    "fsync",
    "fdatasync",
    "replace",
    "rename",
    "remove",
    "unlink",
    "mkdir",
    "rmdir",
    "link",
    "posix_fallocate",
)
_CHANGING_OPEN_FLAGS = os.O_CREAT | os.O_TRUNC
_REAL = {name: getattr(os, name) for name in PATCHED}
_REAL_MMAP = mmap.mmap


def _library_modules() -> list[Any]:
    """The ``compactlog`` modules that see the built-in ``open`` (none of their own)."""
    return [
        module
        for module_name, module in list(sys.modules.items())
        if module is not None
        and module_name.startswith("compactlog")
        and "open" not in module.__dict__
    ]


class _RecordedFile:
    """A file object of the library opened for writing: each write is flushed and is an
    event, so is each truncation."""

    def __init__(self, handle: Any, recorder: Recorder, path: str) -> None:
        self._handle = handle
        self._recorder = recorder
        self._path = path

    def write(self, data: Any) -> int:
        with self._recorder._lock:
            try:
                written = self._handle.write(data)
                self._handle.flush()
            finally:
                self._recorder._event("write", f"{self._path}, {len(data)} B", None, None)
        return written

    def truncate(self, size: int | None = None) -> int:
        with self._recorder._lock:
            try:
                self._handle.flush()
                return self._handle.truncate(size)
            finally:
                self._recorder._event("ftruncate", f"{self._path}, {size}", None, None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def __enter__(self) -> _RecordedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()


def _library_bindings() -> list[tuple[Any, str]]:
    """(module, name) of every ``from os import name`` of a patched function in a
    ``compactlog`` module, whether it holds the real function or a recorder's wrapper (a
    module first imported during a recording binds the wrapper)."""
    found = []
    for module_name, module in list(sys.modules.items()):
        if module is None or not module_name.startswith("compactlog"):
            continue
        for name, real in _REAL.items():
            value = module.__dict__.get(name)
            if value is real or getattr(value, "__wrapped__", None) is real:
                found.append((module, name))
    return found


@dataclass(frozen=True, slots=True)
class Tree:
    """The files under the root at one moment: directory node -> {name: node}, and the
    contents of every file node."""

    entries: dict[int, dict[str, int]]
    data: dict[int, bytes]

    def files(self) -> dict[str, bytes]:
        """Relative path -> contents of every file reachable from the root."""
        return {
            path: self.data[node]
            for path, node in walk(self.entries, self.data)
            if not path.endswith("/")
        }


def walk(entries: dict[int, dict[str, int]], data: dict[int, bytes]) -> Iterator[tuple[str, int]]:
    """(relative path, node) of every file reachable from the root (directories first
    yielded as themselves, so empty ones are kept)."""
    stack = [("", ROOT_NODE)]
    while stack:
        prefix, directory = stack.pop()
        for name, node in sorted(entries.get(directory, {}).items()):
            path = f"{prefix}{name}"
            if node in data:
                yield path, node
            else:
                yield path + "/", node
                stack.append((path + "/", node))


@dataclass(frozen=True, slots=True)
class Event:
    """One file-changing call and the tree right after it."""

    index: int
    call: str
    detail: str
    tree: Tree
    progress: Any  # what the workload had acknowledged before this call ran
    synced_node: int | None = None  # file node whose content the call made durable
    synced_dir: int | None = None  # directory node whose entries the call made durable

    def describe(self) -> str:
        return f"#{self.index} {self.call}({self.detail})"


@dataclass(slots=True)
class Recording:
    """A workload's events; ``initial`` is the tree before the first one (taken as durable:
    the workload's setup ends as after ``sync``)."""

    initial: Tree
    events: list[Event]
    final_progress: Any
    kinds: dict[int, str] = field(default_factory=dict)  # node -> "dir" | "file"
    root: str = ""  # the directory recorded (gone once the workload is over)

    def progress_at_crash(self, index: int) -> Any:
        """What was acknowledged when power was lost right after event ``index``: what the
        workload had acknowledged before the next call began."""
        if index + 1 < len(self.events):
            return self.events[index + 1].progress
        return self.final_progress


class Recorder:
    """Patches ``os`` and ``mmap`` while :meth:`recording` is active; thread-safe (the
    writer's interval thread may sync while the workload appends)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.realpath(root)
        self.progress: Any = None
        self.events: list[Event] = []
        self.kinds: dict[int, str] = {ROOT_NODE: "dir"}
        self._lock = threading.RLock()
        self._nodes: dict[int, int] = {}  # st_ino -> node
        self._live: set[int] = {ROOT_NODE}  # nodes in the last tree
        self._next_node = ROOT_NODE + 1
        self._initial: Tree | None = None
        self._last_data: dict[int, bytes] = {}  # the last tree's contents, to share
        self._hooks: list[tuple[str, str, Callable[[], None]]] = []

    def once_before(self, call: str, detail: str, action: Callable[[], None]) -> None:
        """Run ``action`` once, right before the next ``call`` whose detail starts with
        ``detail`` (e.g. between a publish and its fsync); its own calls are events too."""
        self._hooks.append((call, detail, action))

    def _run_hooks(self, call: str, detail: str) -> None:
        for hook in list(self._hooks):
            if hook[0] == call and detail.startswith(hook[1]) and hook in self._hooks:
                self._hooks.remove(hook)
                hook[2]()

    # -- the recording -------------------------------------------------------------------
    @contextmanager
    def recording(self) -> Iterator[Recorder]:
        self._nodes[os.stat(self.root).st_ino] = ROOT_NODE
        self._initial = self._read_tree()
        patches = self._patches()
        saved = [
            (owner, name, getattr(owner, name))
            for owner, name, _ in patches
            if name != "open" or owner is os
        ]
        for owner, name, value in patches:
            setattr(owner, name, value)
        try:
            yield self
        finally:
            for owner, name, value in saved:
                setattr(owner, name, value)
            for module, name in _library_bindings():  # (modules first imported meanwhile)
                setattr(module, name, _REAL[name])
            for owner, name, _ in patches:
                if name == "open" and owner is not os:
                    del owner.open  # (the built-in again)

    def result(self) -> Recording:
        assert self._initial is not None, "nothing was recorded"
        return Recording(
            self._initial, list(self.events), self.progress, dict(self.kinds), self.root
        )

    def _patches(self) -> list[tuple[Any, str, Any]]:
        wrappers = {name: self._wrap(name, _REAL[name]) for name in PATCHED}
        patches: list[tuple[Any, str, Any]] = [(os, name, w) for name, w in wrappers.items()]
        patches += [(module, name, wrappers[name]) for module, name in _library_bindings()]
        patches.append((mmap, "mmap", self._mmap_class()))
        opener = self._open_file
        patches += [(module, "open", opener) for module in _library_modules()]
        return patches

    def _open_file(self, file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        """The built-in ``open`` as the library's modules see it while recording: a file
        opened for writing reports its writes and truncations as events."""
        handle = builtins.open(file, mode, *args, **kwargs)  # noqa: SIM115 (returned)
        if not set(mode) & set("wax+"):
            return handle
        path = self._relative(file)
        if path is None:
            return handle
        if set(mode) & set("wx"):
            with self._lock:
                self._event("open", f"{path}, {mode}", None, None)
        return _RecordedFile(handle, self, path)

    def _wrap(self, call: str, real: Callable[..., Any]) -> Callable[..., Any]:
        describe = getattr(self, f"_describe_{call}", None) or self._describe_fd_call

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                before = describe(call, args, kwargs)
                if before is None:  # outside the root, or an open that changes nothing
                    return real(*args, **kwargs)
                detail, synced_node, synced_dir = before
                self._run_hooks(call, detail)
                try:
                    return real(*args, **kwargs)
                finally:
                    self._event(call, detail, synced_node, synced_dir)

        wrapper.__wrapped__ = real  # type: ignore[attr-defined]
        return wrapper

    def _mmap_class(self) -> type:
        recorder = self

        class RecordedMmap(_REAL_MMAP):  # type: ignore[misc,valid-type]
            """A shared map whose ``flush`` (``msync``) is an event making its file durable."""

            def __new__(cls, fileno: int, *args: Any, **kwargs: Any) -> RecordedMmap:
                made = super().__new__(cls, fileno, *args, **kwargs)
                made._path = recorder._fd_path(fileno) if fileno >= 0 else None
                made._ino = os.fstat(fileno).st_ino if fileno >= 0 else None
                return made

            def flush(self, *args: Any) -> None:
                with recorder._lock:
                    try:
                        super().flush(*args)
                    finally:
                        if self._path is not None:
                            node = recorder._nodes.get(self._ino)
                            recorder._event("msync", self._path, node, None)

        return RecordedMmap

    # -- describing a call before it runs: (detail, synced node, synced directory) or None -
    def _relative(self, path: Any, dir_fd: int | None = None) -> str | None:
        if isinstance(path, int):
            return self._fd_path(path)
        path = os.fsdecode(path)
        if dir_fd is not None:
            base = os.readlink(f"/proc/self/fd/{dir_fd}")
            path = os.path.join(base, path)
        full = os.path.abspath(path)
        if full == self.root:
            return "."
        if not full.startswith(self.root + os.sep):
            full = os.path.join(os.path.realpath(os.path.dirname(full)), os.path.basename(full))
            if not full.startswith(self.root + os.sep):
                return None
        return os.path.relpath(full, self.root)

    def _fd_path(self, fd: int) -> str | None:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return None
        target = target.removesuffix(" (deleted)")
        if target == self.root:
            return "."
        if not target.startswith(self.root + os.sep):
            return None
        return os.path.relpath(target, self.root)

    def _describe_fd_call(
        self, call: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, int | None, int | None] | None:
        fd = args[0]
        path = self._fd_path(fd)
        if path is None:
            return None
        detail = path
        if call in ("write", "pwrite"):
            detail += f", {len(args[1])} B" + (f" @ {args[2]}" if call == "pwrite" else "")
        elif call == "pwritev":
            detail += f", {sum(map(len, args[1]))} B @ {args[2]}"
        elif call == "ftruncate":
            detail += f", {args[1]}"
        elif call == "posix_fallocate":
            detail += f", {args[1]}+{args[2]}"
        if call not in SYNC_CALLS:
            return detail, None, None
        node = self._nodes.get(os.fstat(fd).st_ino)
        if self.kinds.get(node) == "dir":
            return detail, None, node
        return detail, node, None

    def _describe_open(
        self, call: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, int | None, int | None] | None:
        flags = args[1] if len(args) > 1 else kwargs.get("flags", 0)
        if not flags & _CHANGING_OPEN_FLAGS:
            return None
        path = self._relative(args[0], kwargs.get("dir_fd"))
        if path is None:
            return None
        names = [n for n, f in (("CREAT", os.O_CREAT), ("TRUNC", os.O_TRUNC)) if flags & f]
        return f"{path}, {'|'.join(names)}", None, None

    def _describe_path_call(
        self, call: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, int | None, int | None] | None:
        path = self._relative(args[0], kwargs.get("dir_fd"))
        if path is None:
            return None
        return path + (f", {args[1]}" if call == "truncate" else ""), None, None

    _describe_truncate = _describe_path_call
    _describe_remove = _describe_path_call
    _describe_unlink = _describe_path_call
    _describe_mkdir = _describe_path_call
    _describe_rmdir = _describe_path_call

    def _describe_two_paths(
        self, call: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[str, int | None, int | None] | None:
        source = self._relative(args[0], kwargs.get("src_dir_fd"))
        target = self._relative(args[1], kwargs.get("dst_dir_fd"))
        if source is None and target is None:
            return None
        return f"{source} -> {target}", None, None

    _describe_replace = _describe_two_paths
    _describe_rename = _describe_two_paths
    _describe_link = _describe_two_paths

    # -- after the call --------------------------------------------------------------------
    def _event(
        self, call: str, detail: str, synced_node: int | None, synced_dir: int | None
    ) -> None:
        tree = self._read_tree()
        self.events.append(
            Event(len(self.events), call, detail, tree, self.progress, synced_node, synced_dir)
        )

    def _read_tree(self) -> Tree:
        """Every directory's entries and every file's bytes under the root, as nodes."""
        entries: dict[int, dict[str, int]] = {}
        data: dict[int, bytes] = {}
        live: set[int] = {ROOT_NODE}
        stack = [(self.root, ROOT_NODE)]
        while stack:
            path, directory = stack.pop()
            names: dict[str, int] = {}
            with os.scandir(path) as listing:
                for entry in listing:
                    stat = entry.stat(follow_symlinks=False)
                    node = self._node(stat.st_ino, live)
                    live.add(node)
                    names[entry.name] = node
                    if entry.is_dir(follow_symlinks=False):
                        self.kinds[node] = "dir"
                        stack.append((entry.path, node))
                    elif node not in data:
                        self.kinds[node] = "file"
                        with open(entry.path, "rb") as handle:
                            content = handle.read()
                        previous = self._last_data.get(node)
                        data[node] = previous if previous == content else content  # (shared)
            entries[directory] = names
        self._live = live
        self._last_data = data
        return Tree(entries, data)

    def _node(self, ino: int, live: set[int]) -> int:
        """The node of inode number ``ino``: the same node while the inode stays in the
        tree (``live``: nodes met so far in this walk); a new one for a number the file
        system reused after freeing it."""
        node = self._nodes.get(ino)
        if node is None or (node not in self._live and node not in live):
            node = self._next_node
            self._next_node += 1
            self._nodes[ino] = node
        return node
