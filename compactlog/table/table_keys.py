"""A disk table's keys: the log's declared key format applied to LMDB's byte keys.

A memory table deserializes every key (``str`` for a ``str`` log, the decoded JSON value for
a ``json`` log) and compares, sorts and looks keys up as what the deserializer returns. A
disk table keeps bytes in LMDB; :class:`KeyCodec` makes it answer exactly as a memory table
would:

- ``bytes``: stored as they are; LMDB's byte order is the key order.
- ``str``: UTF-8, which orders as the code points do, so LMDB's order is ``str`` order and
  a ``str`` prefix is a byte prefix of its encoding.
- ``json``: stored as the log's serializer wrote them. Byte order is not JSON value order
  (``10`` < ``9``; escapes), so an ordered read decodes and sorts the keys of its range
  (the whole table, or the keys that start with a ``str`` prefix's encoding): slower than
  ``bytes``/``str`` keys, never in another order.

A key is its stored bytes, for every format, as it is to the cleaner, ``latest()`` and a
memory table's restore (all compare bytes): a JSON key written in two spellings by a
writer that bypasses the serializer (``1`` and `` 1``) is two keys of the log, which decode
to one; write JSON keys through the log's serializer.
"""

from __future__ import annotations

from typing import Any

from ..encoding.serde import Deserializer, Serializer, serializers_of


class KeyCodec:
    """Between a table's keys (what a memory table of the same log holds) and LMDB's."""

    def __init__(self, key_format: str = "bytes") -> None:
        self.format = key_format
        serialize, deserialize = serializers_of(key_format)
        self._serialize: Serializer | None = serialize
        self.decode: Deserializer | None = deserialize  # None: the key is its bytes
        # byte order is key order (an ordered read walks LMDB's cursor)
        self.ordered = key_format in ("bytes", "str")
        self.key_type: type = {"bytes": bytes, "str": str}.get(key_format, object)

    def stored(self, key: Any) -> bytes | None:
        """The LMDB key of ``key`` (``None``: no key of this table can equal it)."""
        if self._serialize is None:
            return key if isinstance(key, bytes) else None
        if self.key_type is not object and not isinstance(key, self.key_type):
            return None
        try:
            return self._serialize(key)
        except (TypeError, ValueError):  # (not JSON: no stored key decodes to it)
            return None

    def key(self, stored: bytes) -> Any:
        """The table key of an LMDB key."""
        return stored if self.decode is None else self.decode(stored)

    def prefix(self, prefix: Any) -> bytes:
        """The LMDB prefix every stored key of a key starting with ``prefix`` starts with."""
        if self.format == "json":
            if not isinstance(prefix, str):
                kind = type(prefix).__name__
                raise TypeError(f"items(prefix=) of json keys takes str, not {kind}")
            encoded = self.stored(prefix)
            assert encoded is not None
            return encoded[:-1]  # "abc -> "abc: JSON escapes each character on its own
        encoded = self.stored(prefix)
        if encoded is None:
            raise TypeError(
                f"items(prefix=) of {self.format} keys takes {self.key_type.__name__}, "
                f"not {type(prefix).__name__}"
            )
        return encoded


def missing_key(key: Any, label: str) -> KeyError:
    """The ``KeyError`` of a lookup that found nothing. A key of a type no key of the table
    has (``table["k"]`` on a table of bytes keys) says which type its keys are, for the
    built-in formats whose keys have one (``label``: the key format, or ``"custom"``)."""
    expected = {"bytes": bytes, "str": str}.get(label)
    if expected is None or isinstance(key, expected):
        return KeyError(key)
    hint = ""
    if isinstance(key, str) and expected is bytes:
        hint = f"; look it up as {key.encode()!r}"
    elif isinstance(key, bytes) and expected is str:
        hint = f"; look it up as {key.decode(errors='replace')!r}"
    return KeyError(
        f"{key!r} is a {type(key).__name__}, and this table's keys are {label} "
        f"(key_format={label!r}){hint}"
    )


__all__ = ["KeyCodec", "missing_key"]
