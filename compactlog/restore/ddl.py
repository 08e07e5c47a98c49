"""A Spark DDL schema (``"id INT, name STRING"``) as the Arrow schema Spark would use.

The Arrow restore engine reads with the Spark source's schema (``options.schema_ddl``)
without a JVM, and Spark parses DDL only in the JVM, so the types a table can have are
mapped here the way ``pyspark.sql.pandas.types.to_arrow_schema`` maps Spark's types
(timestamps as ``timestamp[us, tz=UTC]``). Grammar: ``field (, field)*`` with
``field = name [:] type`` and ``type`` a primitive, ``DECIMAL(p, s)``, ``ARRAY<type>``,
``MAP<type, type>`` or ``STRUCT<field, ...>``; names may be back-quoted. ``NOT NULL`` and
``COMMENT`` are refused (with the Spark engine they work).
"""

from __future__ import annotations

import re

import pyarrow as pa

from ..errors import DdlError, did_you_mean
from .options import SPARK_TYPES

PRIMITIVES = {
    "string": pa.string(),
    "binary": pa.binary(),
    "boolean": pa.bool_(),
    "tinyint": pa.int8(),
    "byte": pa.int8(),
    "smallint": pa.int16(),
    "short": pa.int16(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "long": pa.int64(),
    "float": pa.float32(),
    "real": pa.float32(),
    "double": pa.float64(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ltz": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}
_TOKEN = re.compile(r"\s*(`(?:[^`]|``)*`|[A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:]|\S)")


class _Parser:
    def __init__(self, ddl: str) -> None:
        self.ddl = ddl
        self.tokens = _TOKEN.findall(ddl)
        self.pos = 0

    def fail(self, what: str) -> DdlError:
        near = " ".join(self.tokens[self.pos : self.pos + 3]) or "the end"
        return DdlError(f"schema {self.ddl!r}: {what} near {near!r}")

    def peek(self) -> str:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ""

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if not token or (expected is not None and token.lower() != expected):
            raise self.fail(f"expected {expected or 'more'}")
        self.pos += 1
        return token

    def fields(self, closing: str) -> list[pa.Field]:
        fields = [self.field()]
        while self.peek() == ",":
            self.take(",")
            fields.append(self.field())
        if self.peek() != closing:
            raise self.fail("expected ',' or the end of the fields")
        return fields

    def field(self) -> pa.Field:
        name = self.take()
        if name.startswith("`"):
            name = name[1:-1].replace("``", "`")
        elif not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise self.fail("expected a column name")
        if self.peek() == ":":
            self.take(":")
        type_ = self.type()
        if self.peek().lower() in ("not", "comment", "default"):
            raise self.fail("NOT NULL, COMMENT and DEFAULT need the Spark engine")
        return pa.field(name, type_)

    def type(self) -> pa.DataType:
        word = self.take().lower()
        if word in PRIMITIVES:
            return PRIMITIVES[word]
        if word in ("decimal", "dec", "numeric"):
            precision, scale = 10, 0
            if self.peek() == "(":
                self.take("(")
                precision = int(self.take())
                if self.peek() == ",":
                    self.take(",")
                    scale = int(self.take())
                self.take(")")
            return pa.decimal128(precision, scale)
        if word in ("varchar", "char"):
            self.take("(")
            self.take()
            self.take(")")
            return pa.string()
        if word == "array":
            self.take("<")
            item = self.type()
            self.take(">")
            return pa.list_(item)
        if word == "map":
            self.take("<")
            key = self.type()
            self.take(",")
            value = self.type()
            self.take(">")
            return pa.map_(key, value)
        if word == "struct":
            self.take("<")
            fields = self.fields(">")
            self.take(">")
            return pa.struct(fields)
        self.pos -= 1
        if word in SPARK_TYPES:
            raise self.fail(f"type {word!r} has no Arrow type here; it needs the Spark engine")
        raise self.fail(f"unknown type {word!r}{did_you_mean(word, SPARK_TYPES)}")


def arrow_schema(ddl: str) -> pa.Schema:
    """The Arrow schema of the DDL ``ddl``; :class:`DdlError` names what it cannot read."""
    parser = _Parser(ddl)
    fields = parser.fields("")
    return pa.schema(fields)


__all__ = ["PRIMITIVES", "DdlError", "arrow_schema"]
