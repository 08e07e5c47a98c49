"""Crash-state builders: the file trees a power loss right after event ``i`` may leave.

Each model turns a :class:`~tests.powerloss.recorder.Recording` into, for every event, the
list of :class:`CrashState` it allows (deduplicated; ``variant`` says how each was built).
The initial tree (before the first event) is durable in every model. See
docs/powerloss.md for the crash model in words.

- ``strict`` (POSIX): a file's content is what it had at its last ``fsync``/``fdatasync``
  (any descriptor of the inode; ``msync`` too; stores into its mapped pages count), a
  directory's entries are those at its last directory ``fsync``; a new file whose directory
  was never fsynced does not exist, a rename or unlink not followed by a directory fsync did
  not happen, a new directory needs its parent fsynced.
- ``ordered`` (ext4 ``data=ordered`` / xfs-like): every call's metadata (create, rename,
  unlink, link, mkdir, truncate, size changes) reaches disk in call order, any prefix of
  the calls since the last sync of anything (a sync commits the journal); each file's data
  sectors (512 B) that differ from the file's last sync are each either old or new.
- slow models (``reordered``: btrfs-like, metadata of the calls since the last sync in any
  order, a bounded enumeration; ``garbled``: ``ordered`` metadata, unsynced sectors old,
  new or garbage where the unsynced writes changed them, as SQLite's crash tests fill
  unsynced sectors).
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import combinations

from .recorder import ROOT_NODE, SYNC_CALLS, Recording, Tree, walk

SECTOR = 512
MAX_METADATA_PREFIXES = 8  # metadata prefixes tried per crash point (evenly spread)
MAX_ORDER_PREFIXES = 8  # write-order prefixes of unsynced sectors per crash point
RANDOM_SUBSETS = 3  # seeded random choices of unsynced sectors per crash point
MAX_REORDERED = 32  # metadata subsets per crash point in the reordered model


@dataclass(frozen=True, slots=True)
class CrashState:
    """A file tree after a power loss: directories and files by relative path."""

    dirs: tuple[str, ...]
    files: tuple[tuple[str, bytes], ...]
    variant: str

    def digest(self) -> bytes:
        hasher = hashlib.sha256()
        for path in self.dirs:
            hasher.update(b"d" + path.encode() + b"\0")
        for path, data in self.files:
            hasher.update(b"f" + path.encode() + b"\0" + len(data).to_bytes(8, "little"))
            hasher.update(data)
        return hasher.digest()

    def materialize(self, target: str) -> None:
        """Write this tree under ``target`` (which must exist)."""
        for path in self.dirs:
            os.makedirs(os.path.join(target, path), exist_ok=True)
        for path, data in self.files:
            with open(os.path.join(target, path), "wb") as handle:
                handle.write(data)

    def exists(self, path: str) -> bool:
        return path in self.dirs or any(name == path for name, _ in self.files)


def assemble(
    entries: dict[int, dict[str, int]], content: Callable[[int], bytes], kinds: dict[int, str]
) -> tuple[tuple[str, ...], tuple[tuple[str, bytes], ...]]:
    """Directories and files reachable from the root through ``entries``."""
    dirs: list[str] = []
    files: list[tuple[str, bytes]] = []
    stack = [("", ROOT_NODE)]
    seen = {ROOT_NODE}
    while stack:
        prefix, directory = stack.pop()
        for name, node in sorted(entries.get(directory, {}).items()):
            path = prefix + name
            if kinds.get(node) == "dir":
                if node in seen:  # (a directory renamed into itself cannot happen; be safe)
                    continue
                seen.add(node)
                dirs.append(path)
                stack.append((path + "/", node))
            else:
                files.append((path, content(node)))
    return tuple(sorted(dirs)), tuple(sorted(files))


class _Dedup:
    """Keeps the first of equal states for one crash point."""

    def __init__(self) -> None:
        self.states: list[CrashState] = []
        self._seen: set[bytes] = set()

    def add(self, state: CrashState) -> None:
        digest = state.digest()
        if digest not in self._seen:
            self._seen.add(digest)
            self.states.append(state)


def strict(recording: Recording, seed: int = 0) -> Iterator[list[CrashState]]:
    """POSIX strict: one state per crash point."""
    entries = {d: dict(names) for d, names in recording.initial.entries.items()}
    data = dict(recording.initial.data)
    for event in recording.events:
        tree = event.tree
        if event.synced_node is not None and event.synced_node in tree.data:
            data[event.synced_node] = tree.data[event.synced_node]
        if event.synced_dir is not None:
            entries[event.synced_dir] = dict(tree.entries.get(event.synced_dir, {}))
        dirs, files = assemble(entries, lambda node: data.get(node, b""), recording.kinds)
        yield [CrashState(dirs, files, "synced data, fsynced directory entries")]


class _Progress:
    """Shared bookkeeping of the ordered-family models while walking the events: the last
    journal commit, the calls since, each file's data at its last sync and the order in
    which its sectors changed since."""

    def __init__(self, recording: Recording) -> None:
        self.kinds = recording.kinds
        self.committed: Tree = recording.initial
        self.pending: list[Tree] = []  # the tree after each call since the last commit
        self.pending_events: list[int] = []  # (their event numbers)
        self.synced: dict[int, bytes] = dict(recording.initial.data)
        self.latest: dict[int, bytes] = dict(recording.initial.data)
        self.first_change: dict[tuple[int, int], int] = {}  # (node, sector) -> event

    def step(self, index: int, call: str, tree: Tree, synced_node: int | None) -> None:
        for node, new in tree.data.items():
            old = self.latest.get(node, b"")
            if old != new:
                for sector in changed_sectors(old, new):
                    self.first_change.setdefault((node, sector), index)
                self.latest[node] = new
        if call in SYNC_CALLS or synced_node is not None:
            self.committed = tree
            self.pending = []
            self.pending_events = []
        else:
            self.pending.append(tree)
            self.pending_events.append(index)
        if synced_node is not None and synced_node in tree.data:
            self.synced[synced_node] = tree.data[synced_node]
            for key in [k for k in self.first_change if k[0] == synced_node]:
                del self.first_change[key]

    def metadata_points(self) -> list[Tree]:
        """The namespaces (with sizes) a prefix of the pending calls leaves, evenly
        spread when there are many: the committed one first, the current one last."""
        trees = [self.committed, *self.pending]
        if len(trees) <= MAX_METADATA_PREFIXES:
            return trees
        step = (len(trees) - 1) / (MAX_METADATA_PREFIXES - 1)
        picks = sorted({round(i * step) for i in range(MAX_METADATA_PREFIXES)})
        return [trees[i] for i in picks]

    def unsynced(self, tree: Tree) -> list[tuple[int, int]]:
        """(node, sector) of every sector of ``tree``'s files whose current data differs
        from its last sync, in the order they were first written."""
        found = []
        for node, size in ((n, len(d)) for n, d in tree.data.items()):
            old, new = self.synced.get(node, b""), self.latest.get(node, b"")
            for sector in range((size + SECTOR - 1) // SECTOR):
                if sector_of(old, sector) != sector_of(new, sector):
                    found.append((node, sector))
        found.sort(key=lambda key: (self.first_change.get(key, -1), key))
        return found

    def state(
        self, tree: Tree, choose: Callable[[int, int, bytes, bytes], bytes], variant: str
    ) -> CrashState:
        """``tree``'s namespace and sizes, each sector's bytes from ``choose(node, sector,
        old, new)``."""

        def content(node: int) -> bytes:
            size = len(tree.data.get(node, b""))
            old, new = self.synced.get(node, b""), self.latest.get(node, b"")
            sectors = [
                choose(node, s, sector_of(old, s), sector_of(new, s))
                for s in range((size + SECTOR - 1) // SECTOR)
            ]
            return b"".join(sectors)[:size]

        dirs, files = assemble(tree.entries, content, self.kinds)
        return CrashState(dirs, files, variant)


def sector_of(data: bytes, sector: int) -> bytes:
    chunk = data[sector * SECTOR : (sector + 1) * SECTOR]
    return chunk + bytes(SECTOR - len(chunk))


def changed_sectors(old: bytes, new: bytes) -> list[int]:
    count = (max(len(old), len(new)) + SECTOR - 1) // SECTOR
    return [s for s in range(count) if sector_of(old, s) != sector_of(new, s)]


def _old(node: int, sector: int, old: bytes, new: bytes) -> bytes:
    return old


def _new(node: int, sector: int, old: bytes, new: bytes) -> bytes:
    return new


def _chosen(new_ones: set[tuple[int, int]]) -> Callable[[int, int, bytes, bytes], bytes]:
    def choose(node: int, sector: int, old: bytes, new: bytes) -> bytes:
        return new if (node, sector) in new_ones else old

    return choose


def _spread(count: int, limit: int) -> list[int]:
    """Up to ``limit`` values in ``1 .. count - 1``, evenly spread."""
    if count <= 1:
        return []
    if count - 1 <= limit:
        return list(range(1, count))
    return sorted({1 + round(i * (count - 2) / (limit - 1)) for i in range(limit)})


def ordered(recording: Recording, seed: int = 0) -> Iterator[list[CrashState]]:
    """ext4 ``data=ordered`` / xfs-like: metadata prefixes, unsynced sectors old or new."""
    progress = _Progress(recording)
    for event in recording.events:
        progress.step(event.index, event.call, event.tree, event.synced_node)
        found = _Dedup()
        points = progress.metadata_points()
        for number, tree in enumerate(points):
            label = f"metadata of {len(progress.pending)} pending calls, prefix {number}"
            found.add(progress.state(tree, _new, f"{label}, data new"))
            found.add(progress.state(tree, _old, f"{label}, data at last sync"))
        tree = points[-1]
        sectors = progress.unsynced(tree)
        for k in _spread(len(sectors), MAX_ORDER_PREFIXES):
            variant = f"all metadata, first {k} of {len(sectors)} unsynced sectors new"
            found.add(progress.state(tree, _chosen(set(sectors[:k])), variant))
        rng = random.Random(f"{seed}:{event.index}")
        for n in range(RANDOM_SUBSETS if len(sectors) > 1 else 0):
            picked = {key for key in sectors if rng.random() < 0.5}
            variant = f"all metadata, random subset {n} of {len(sectors)} unsynced sectors new"
            found.add(progress.state(tree, _chosen(picked), variant))
        yield found.states


def ordered_with_new(recording: Recording, index: int, new_paths: set[str]) -> CrashState:
    """One state the ordered model allows after event ``index``: all metadata on disk, the
    files at ``new_paths`` with their current data, every other file's unsynced sectors
    old (e.g. a head that reached disk while the data it describes did not)."""
    progress = _Progress(recording)
    for event in recording.events[: index + 1]:
        progress.step(event.index, event.call, event.tree, event.synced_node)
    tree = recording.events[index].tree
    fresh = {node for path, node in walk(tree.entries, tree.data) if path in new_paths}

    def choose(node: int, sector: int, old: bytes, new: bytes) -> bytes:
        return new if node in fresh else old

    return progress.state(tree, choose, f"all metadata, new data only in {sorted(new_paths)}")


def reordered(recording: Recording, seed: int = 0) -> Iterator[list[CrashState]]:
    """btrfs-like (slow): the metadata of the calls since the last sync in any order (each
    call's own changes atomic), a bounded enumeration of subsets; data all new or all old."""
    progress = _Progress(recording)
    for event in recording.events:
        progress.step(event.index, event.call, event.tree, event.synced_node)
        found = _Dedup()
        diffs = _call_diffs(progress.committed, progress.pending)
        changing = [i for i, diff in enumerate(diffs) if diff]
        rng = random.Random(f"{seed}:{event.index}")
        subsets: list[tuple[int, ...]] = []
        if 2 ** len(changing) <= MAX_REORDERED:
            for size in range(len(changing) + 1):
                subsets.extend(combinations(changing, size))
        else:
            subsets = [tuple(i for i in changing if rng.random() < 0.5) for _ in range(32)]
        for subset in subsets:
            chosen = [diffs[i] for i in subset]
            tree = _apply(progress.committed, chosen, progress.latest, progress.kinds)
            calls = [progress.pending_events[i] for i in subset]
            label = f"metadata of calls {calls} only, of {len(changing)} pending"
            found.add(progress.state(tree, _new, f"{label}, data new"))
            found.add(progress.state(tree, _old, f"{label}, data at last sync"))
        yield found.states


def garbled(recording: Recording, seed: int = 0) -> Iterator[list[CrashState]]:
    """``ordered`` metadata (every prefix tried), unsynced sectors each old, new or garbage
    (slow): torn writes that leave neither version."""
    progress = _Progress(recording)
    for event in recording.events:
        progress.step(event.index, event.call, event.tree, event.synced_node)
        found = _Dedup()
        rng = random.Random(f"{seed}:{event.index}")
        for number, tree in enumerate(progress.metadata_points()):
            sectors = progress.unsynced(tree)
            if not sectors:
                continue
            label = f"metadata prefix {number}"
            found.add(progress.state(tree, _garbage(rng, set(sectors)), f"{label}, all garbage"))
            for n in range(RANDOM_SUBSETS):
                mixed = _mixture(rng, set(sectors))
                found.add(progress.state(tree, mixed, f"{label}, old/new/garbage mixture {n}"))
        yield found.states


def _garbage(
    rng: random.Random, unsynced: set[tuple[int, int]]
) -> Callable[[int, int, bytes, bytes], bytes]:
    def choose(node: int, sector: int, old: bytes, new: bytes) -> bytes:
        return _garble(rng, old, new) if (node, sector) in unsynced else new

    return choose


def _mixture(
    rng: random.Random, unsynced: set[tuple[int, int]]
) -> Callable[[int, int, bytes, bytes], bytes]:
    def choose(node: int, sector: int, old: bytes, new: bytes) -> bytes:
        if (node, sector) not in unsynced:
            return new
        return rng.choice((old, new, _garble(rng, old, new)))

    return choose


def _garble(rng: random.Random, old: bytes, new: bytes) -> bytes:
    """``new`` with every byte that the unsynced writes changed replaced by garbage: the
    bytes they left alone stay (SQLite's "powersafe overwrite": a write does not damage
    the rest of its sector)."""
    noise = rng.randbytes(len(new))
    return bytes(n if o == n else g for o, n, g in zip(old, new, noise, strict=True))


Diff = tuple[tuple[tuple[int, str, int | None], ...], tuple[tuple[int, int], ...]]


def _call_diffs(committed: Tree, pending: list[Tree]) -> list[Diff]:
    """Each pending call's own metadata: entry changes (dir, name, node or None) and size
    changes (node, size)."""
    diffs: list[Diff] = []
    before = committed
    for after in pending:
        changes = []
        for directory in set(before.entries) | set(after.entries):
            old, new = before.entries.get(directory, {}), after.entries.get(directory, {})
            for name in set(old) | set(new):
                if old.get(name) != new.get(name):
                    changes.append((directory, name, new.get(name)))
        sizes = tuple(
            (node, len(data))
            for node, data in after.data.items()
            if len(before.data.get(node, b"")) != len(data)
        )
        diffs.append((tuple(sorted(changes, key=repr)), sizes) if changes or sizes else ((), ()))
        before = after
    return diffs


def _apply(
    committed: Tree, diffs: list[Diff], latest: dict[int, bytes], kinds: dict[int, str]
) -> Tree:
    """``committed`` with some calls' metadata applied (sizes only: the data is chosen by
    sector later)."""
    entries = {d: dict(names) for d, names in committed.entries.items()}
    sizes = {node: len(data) for node, data in committed.data.items()}
    for changes, resized in diffs:
        for directory, name, node in changes:
            names = entries.setdefault(directory, {})
            if node is None:
                names.pop(name, None)
            else:
                names[name] = node
        sizes.update(resized)
    data = {}
    for names in entries.values():
        for node in names.values():
            if kinds.get(node) == "file":  # a stand-in of the right size
                data[node] = bytes(sizes.get(node, len(latest.get(node, b""))))
    return Tree(entries, data)


MODELS: dict[str, Callable[[Recording, int], Iterator[list[CrashState]]]] = {
    "strict": strict,
    "ordered": ordered,
}
SLOW_MODELS: dict[str, Callable[[Recording, int], Iterator[list[CrashState]]]] = {
    "reordered": reordered,
    "garbled": garbled,
}
