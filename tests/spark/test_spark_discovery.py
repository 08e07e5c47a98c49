"""``spark.read.format("compactlog")`` is found with no call, from any directory.

PySpark (4.x) finds Python data sources in a worker that runs ``pkgutil.iter_modules()``
over its ``sys.path`` and imports every ``pyspark_*`` module it lists
(``pyspark/sql/worker/lookup_data_sources.py``). These tests run as a user does: this
project's own interpreter (the editable install ``make`` made), started in a directory
outside the checkout, the virtual environment's ``bin`` first on ``PATH`` as after
``activate``, and no ``register`` call. The wheel install is covered in
``tests/test_wheel.py``. The shared session of ``conftest.py`` registers the source, so the
Spark test starts its own (about 10 s).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]

READ_WITH_NO_REGISTER_CALL = textwrap.dedent(
    """
    import sys
    import compactlog
    from pyspark.sql import SparkSession

    with compactlog.open(sys.argv[1]) as log:
        log.append(b"k1", b"v1")
        log.append(b"k2", b"v2")
        log.append(b"k1", b"v3")
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    rows = spark.read.format("compactlog").load(sys.argv[1]).orderBy("key").collect()
    print([(bytes(row.key), bytes(row.value)) for row in rows])
    """
)


def user_env(bin_dir: Path) -> dict[str, str]:
    """The environment of a user who activated the virtual environment of ``bin_dir``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")
    }
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    return env


def read_with_no_register_call(python: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run :data:`READ_WITH_NO_REGISTER_CALL` with ``python`` in ``cwd`` as a user would."""
    return subprocess.run(
        [str(python), "-c", READ_WITH_NO_REGISTER_CALL, str(cwd / "log")],
        cwd=cwd,
        env=user_env(python.parent),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_pkgutil_lists_pyspark_compactlog_outside_the_checkout(tmp_path):
    listing = subprocess.run(
        [sys.executable, "-c", "import pkgutil; print([m.name for m in pkgutil.iter_modules()])"],
        cwd=tmp_path,
        env=user_env(Path(sys.executable).parent),
        capture_output=True,
        text=True,
        check=True,
    )
    assert "'pyspark_compactlog'" in listing.stdout


def test_format_compactlog_is_found_from_another_directory_with_no_register_call(tmp_path):
    assert CHECKOUT not in tmp_path.parents
    result = read_with_no_register_call(Path(sys.executable), tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[(b'k1', b'v3'), (b'k2', b'v2')]"
