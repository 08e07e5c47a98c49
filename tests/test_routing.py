"""Key routing for a directory of ``partition-<N>`` logs (compactlog/routing.py): the
hash is pinned, the vectorized form equals the reference, an application routes without
pyspark, and a table over a directory of logs named otherwise says what to open."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.errors import ConfigError, NotALogError
from compactlog.routing import (
    fnv1a64,
    key_partitions,
    open_partition,
    partition_for,
    partition_path,
)
from compactlog.storage.logdirs import partition_dir
from compactlog.table.table import Table


def test_the_key_hash_is_fnv1a_64():
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=60),
    st.integers(1, 17),
    st.integers(0, 5),
)
def test_vectorized_partitions_equal_the_reference(keys, count, skip):
    array = pa.array(keys, type=pa.binary()).slice(min(skip, len(keys)))
    expected = [partition_for(k, count) for k in keys[min(skip, len(keys)) :]]
    assert expected == [0 if k is None else fnv1a64(k) % count for k in keys[skip:]]
    assert key_partitions(array, count).tolist() == expected


def test_a_str_key_routes_as_its_utf8_bytes():
    assert partition_for("caf\u00e9", 7) == partition_for("caf\u00e9".encode(), 7)
    with pytest.raises(ConfigError, match="positive int"):
        partition_for(b"k", 0)


def partitioned(tmp_path, count=3, **config):
    table = tmp_path / "orders"
    for number in range(count):
        compactlog.open(partition_dir(str(table), number), **config).close()
    return table


def test_an_application_appends_to_the_log_of_each_key_and_a_table_reads_them(tmp_path):
    table = partitioned(tmp_path, key_format="str", value_format="json")
    users = {f"user:{i}": {"n": i} for i in range(50)}
    for key, value in users.items():
        with open_partition(table, key) as log:
            log.append(key, value)
    for key in users:
        assert partition_path(table, key) == partition_dir(str(table), partition_for(key, 3))
    with Table(table, follow=False) as state:
        assert dict(state) == users
        assert all(offset > 0 for offset in state.offsets.values())


def test_routing_imports_and_runs_without_pyspark(tmp_path):
    """Regression: routing keys lived in compactlog.spark.partitioned, which imports
    pyspark at import time."""
    table = partitioned(tmp_path)
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["pyspark"] = None  # any import of pyspark now raises ImportError
        import compactlog, compactlog.routing, compactlog.table
        with compactlog.routing.open_partition({str(table)!r}, b"k") as log:
            log.append(b"k", b"v")
        with compactlog.Table({str(table)!r}, follow=False) as state:
            assert state[b"k"] == b"v"
        assert "pyspark.sql" not in sys.modules
        print(compactlog.routing.partition_for(b"k", 3))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(partition_for(b"k", 3))


def test_a_table_over_logs_not_named_partition_n_says_which_to_open(tmp_path):
    """Regression: docs/operations.md showed ``orders/0``, which Table refused with a bare
    'not a compactlog log (no meta file)'."""
    for name in ("0", "1"):
        compactlog.open(tmp_path / "orders" / name).close()
    with pytest.raises(NotALogError, match="partition-<N>") as caught:
        Table(tmp_path / "orders")
    assert str(tmp_path / "orders" / "0") in str(caught.value)
    with pytest.raises(NotALogError):
        partition_path(tmp_path / "orders", b"k")


def test_a_partitioned_directory_missing_a_log_is_refused(tmp_path):
    table = partitioned(tmp_path, count=3)
    shutil.rmtree(partition_dir(str(table), 1))
    with pytest.raises(ConfigError, match="found partitions 0, 2"):
        partition_path(table, b"k")
