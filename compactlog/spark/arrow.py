"""The Arrow schema Spark expects: the one Spark-specific step of the Arrow conversion.

Everything else (columns to Arrow, value decoding) is :mod:`compactlog.arrow.convert`,
shared with ``Log.read_arrow`` and the Arrow restore engine.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa


def target_schema(spark_schema: Any) -> pa.Schema:
    """The Arrow schema Spark expects for ``spark_schema`` (its own conversion)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema, timezone="UTC")


__all__ = ["target_schema"]
