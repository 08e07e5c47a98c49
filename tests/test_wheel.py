"""The wheel users install is complete: built, installed with its ``spark`` extra into a
fresh virtual environment outside the checkout, and exercised there.

A wheel once shipped without ``compactlog.compaction`` while every test passed, because the
tests imported the checkout. Here the checkout is never on ``sys.path``: every command runs
in a temporary directory with the fresh environment's interpreter, so a module missing from
the wheel fails the import walk.

Slow (about a minute with a warm pip cache: pyspark is large), so it carries the ``wheel``
marker: ``pytest -m "not wheel"`` leaves it out; ``make test`` runs it.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parent.parent

NOT_SOURCE = (
    ".venv",
    ".git",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    ".ruff_cache",
    "demo-data",
    "bench-data",
)

pytestmark = [pytest.mark.wheel, pytest.mark.timeout(1200)]

IMPORT_EVERY_MODULE = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys
    import compactlog
    names = []
    for info in pkgutil.walk_packages(compactlog.__path__, "compactlog."):
        importlib.import_module(info.name)  # spark modules too: the extra is installed
        names.append(info.name)
    print(json.dumps({"file": compactlog.__file__, "path": sys.path, "modules": names}))
    """
)

WRITE_A_LOG = textwrap.dedent(
    """
    import sys, compactlog
    with compactlog.open(sys.argv[1], segment_bytes=4096, min_cleanable_dirty_ratio=0.0) as log:
        for i in range(3000):
            log.append(b"k%d" % (i % 50), b"v%d" % i)
    """
)


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    result = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, (
        f"{' '.join(args)} exited {result.returncode}\n"
        f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
    )
    return result.stdout


def _console_scripts(wheel: Path) -> list[str]:
    """The console scripts the wheel declares (``entry_points.txt``)."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        assert names, "the wheel declares no entry points"
        parser = configparser.ConfigParser()
        parser.read_string(archive.read(names[0]).decode())
    return sorted(parser["console_scripts"]) if parser.has_section("console_scripts") else []


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, Path]:
    """``(wheel, venv bin directory, a scratch directory outside the checkout)``."""
    root = tmp_path_factory.mktemp("wheel")
    assert CHECKOUT not in root.parents
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_NO_CACHE_DIR")}
    # build from a copy: setuptools keeps ``build/`` in the source tree and would ship
    # stale modules left there by an earlier build (and litter the checkout)
    source = root / "source"
    shutil.copytree(CHECKOUT, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    wheelhouse = root / "wheelhouse"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheelhouse), "."],
        cwd=source,
        env=env,
    )
    wheels = sorted(wheelhouse.glob("compactlog-*.whl"))
    assert len(wheels) == 1, wheels
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=root, env=env)
    bin_dir = venv / "bin"
    _run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", f"{wheels[0]}[spark]"],
        cwd=root,
        env=env,
    )
    scratch = root / "scratch"
    scratch.mkdir()
    return wheels[0], bin_dir, scratch


def _env(bin_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["NO_COLOR"] = "1"
    return env


def test_every_module_of_the_installed_package_imports_outside_the_checkout(installed):
    _wheel, bin_dir, scratch = installed
    out = _run([str(bin_dir / "python"), "-c", IMPORT_EVERY_MODULE], scratch, _env(bin_dir))
    report = json.loads(out.strip().splitlines()[-1])
    assert Path(report["file"]).is_relative_to(bin_dir.parent), report["file"]
    assert not any(p and Path(p).resolve() == CHECKOUT for p in report["path"])
    modules = set(report["modules"])
    # the packages a hand-kept list once forgot, and the two installed under compactlog.
    for required in ("compactlog.compaction", "compactlog.cli", "compactlog.cli.main"):
        assert required in modules, sorted(modules)
    # every module file of the checkout's packages is in the installed package
    expected = {
        "compactlog." + ".".join(p.relative_to(CHECKOUT / "compactlog").with_suffix("").parts)
        for p in (CHECKOUT / "compactlog").rglob("*.py")
        if p.name != "__init__.py"
    } | {
        "compactlog.cli." + ".".join(p.relative_to(CHECKOUT / "cli").with_suffix("").parts)
        for p in (CHECKOUT / "cli").rglob("*.py")
        if p.name != "__init__.py"
    }
    assert expected <= modules, sorted(expected - modules)


def test_the_installed_cli_runs_demo_and_compact(installed):
    _wheel, bin_dir, scratch = installed
    env = _env(bin_dir)
    demo = scratch / "demo" / "log"
    summary = json.loads(
        _run(
            [
                str(bin_dir / "compactlog"),
                "demo",
                "--path",
                str(demo),
                "--updates",
                "3000",
                "--keys",
                "300",
                "--json",
            ],
            scratch,
            env,
        )
    )
    # the whole story from the wheel: compaction, snapshot, Spark restore to Parquet
    assert summary["matches_model"] is True, summary
    assert summary["rows"] == summary["live_keys"] > 0, summary
    log = scratch / "small"
    _run([str(bin_dir / "python"), "-c", WRITE_A_LOG, str(log)], scratch, env)
    result = json.loads(
        _run([str(bin_dir / "compactlog"), "compact", str(log), "--json"], scratch, env)
    )
    stats = result["stats"]
    assert stats["bytes_written"] < stats["bytes_read"], stats
    _run([str(bin_dir / "compactlog"), "verify", str(log)], scratch, env)


def test_every_console_script_the_wheel_declares_answers_help(installed):
    wheel, bin_dir, scratch = installed
    scripts = _console_scripts(wheel)
    assert "compactlog" in scripts
    for script in scripts:
        out = _run([str(bin_dir / script), "--help"], scratch, _env(bin_dir), timeout=120)
        assert "Usage" in out or "usage" in out, (script, out)


def test_the_wheel_ships_py_typed_and_python_m_compactlog_runs_the_cli(installed):
    wheel, bin_dir, scratch = installed
    with zipfile.ZipFile(wheel) as archive:
        assert "compactlog/py.typed" in archive.namelist()
    out = _run([str(bin_dir / "python"), "-m", "compactlog", "--help"], scratch, _env(bin_dir))
    assert "Usage: compactlog" in out, out


def test_format_compactlog_is_found_in_the_wheel_install_with_no_register_call(installed):
    from tests.spark.test_spark_discovery import read_with_no_register_call

    _wheel, bin_dir, scratch = installed
    where = scratch / "discovery"
    where.mkdir()
    result = read_with_no_register_call(bin_dir / "python", where)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[(b'k1', b'v3'), (b'k2', b'v2')]"
