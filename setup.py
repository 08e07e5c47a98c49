"""Package discovery for the one `compactlog` distribution.

The repository keeps three top-level folders (`compactlog/`, `cli/`, `cleaner/`), but only
`compactlog` may be a top-level import name: `cli` and `cleaner` would collide with other
distributions. So `cli/` installs as `compactlog.cli` and `cleaner/` as `compactlog.cleaner`,
and every subpackage below any of the three is found by walking the folders, never listed by
hand (a hand-kept list once shipped a wheel without `compactlog.compaction`).
Everything else about the distribution lives in `pyproject.toml`.
"""

import shutil
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent

# import prefix -> folder in this repository
PACKAGE_ROOTS = {
    "compactlog": "compactlog",
    "compactlog.cli": "cli",
    "compactlog.cleaner": "cleaner",
}

# Top-level modules that must keep their own name (PySpark finds `pyspark_*` modules).
TOP_LEVEL_MODULES = sorted(path.stem for path in HERE.glob("pyspark_*.py"))


def discover_packages() -> tuple[list[str], dict[str, str]]:
    """Every package under each root, with the folder each one lives in."""
    packages: list[str] = []
    package_dir: dict[str, str] = {}
    for prefix, folder in PACKAGE_ROOTS.items():
        packages.append(prefix)
        package_dir[prefix] = folder
        for sub in find_packages(where=str(HERE / folder)):
            packages.append(f"{prefix}.{sub}")
    return packages, package_dir


class BuildPyWithSparkEntry(build_py):
    """``build_py`` that also puts a real file of each ``pyspark_*`` module in an editable
    install.

    PySpark finds Python data sources with ``pkgutil.iter_modules()``, which lists the files
    of ``sys.path`` entries only; an editable install maps its top-level names through a
    meta-path finder that no such listing sees, so ``format("compactlog")`` was found only
    from the checkout's root. A wheel puts ``pyspark_compactlog.py`` in site-packages; this
    does the same for an editable wheel (setuptools points ``install_lib`` at the editable
    wheel's root while it builds one). The module is a one-line import of
    ``compactlog.spark.source``, so the copy never goes stale with edits to the package.
    """

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            root = Path(self.get_finalized_command("install").install_lib)
            for module in TOP_LEVEL_MODULES:
                shutil.copyfile(HERE / f"{module}.py", root / f"{module}.py")


packages, package_dir = discover_packages()
setup(
    packages=packages,
    package_dir=package_dir,
    py_modules=TOP_LEVEL_MODULES,
    cmdclass={"build_py": BuildPyWithSparkEntry},
)
