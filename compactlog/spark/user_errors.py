"""Our message first: how a compactlog error reaches a Spark user.

PySpark runs a Python data source in worker processes and reports an exception raised
there as Spark's prefix (``[PYTHON_DATA_SOURCE_ERROR] Failed to create Python data source
instance: ``) followed by the worker's formatted exception: a whole Python traceback, with
our message on its last line (``pyspark.util.handle_worker_exception``). The data source
API gives no way to choose that first line. What it does honour is ``SPARK_HIDE_TRACEBACK``
in the worker's environment, read when the exception is formatted: with it the text after
Spark's prefix is ``compactlog.errors.ConfigError: <our message>``.

:func:`ours` sets it for a :class:`~compactlog.errors.CompactLogError` only (an input or
log problem whose message says everything; a bug keeps its traceback) and only inside a
Spark Python worker, which reports the error and exits (``sys.exit(-1)`` in every PySpark
worker loop), so no later error of that process is affected. In the driver (tests, the
CLI) nothing changes.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import CompactLogError

F = TypeVar("F", bound=Callable[..., Any])


def in_spark_worker() -> bool:
    """Whether this process is a PySpark worker (its ``__main__`` is a ``pyspark`` module:
    the daemon, a worker or a planner)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return bool(spec and str(spec.name).startswith("pyspark."))


def ours(method: F) -> F:
    """Decorate a data source entry point: a compactlog error it raises in a Spark worker is
    reported without the traceback, so our message follows Spark's prefix."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except CompactLogError:
            if in_spark_worker():
                os.environ["SPARK_HIDE_TRACEBACK"] = "1"
            raise

    return wrapper  # type: ignore[return-value]
