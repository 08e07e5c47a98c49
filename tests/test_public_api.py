"""What a user reads with ``help()`` and ``import``: the package's public names.

Every public name of ``compactlog`` has its own docstring, and so has every public method
and property of its classes (an inherited ``Mapping.keys`` docstring, "D.keys() -> a
set-like object...", does not count: ``Table.keys`` takes ``start``/``stop``/``prefix``).
Every error a user can meet is importable from ``compactlog`` itself.
"""

from __future__ import annotations

import inspect

import pytest

import compactlog
import compactlog.errors


def undocumented(owner: type, name: str) -> bool:
    """Whether ``name`` is defined by compactlog's code in ``owner``'s MRO without a
    docstring of its own (``help()`` would show a base class's, or none)."""
    for klass in owner.__mro__:
        if name in vars(klass):
            if not klass.__module__.startswith("compactlog"):
                return False  # (the standard library's or a dependency's, as it documents it)
            attribute = vars(klass)[name]
            function = getattr(attribute, "fget", None) or getattr(attribute, "__func__", None)
            return not (function or attribute).__doc__
    return False


PUBLIC_CLASSES = [
    value for name in compactlog.__all__ if inspect.isclass(value := getattr(compactlog, name))
]


@pytest.mark.parametrize("name", compactlog.__all__)
def test_every_public_name_has_a_docstring_of_its_own(name):
    value = getattr(compactlog, name)
    if name == "FORMAT_VERSION":
        return  # (an int)
    assert inspect.getdoc(value), name


@pytest.mark.parametrize("klass", PUBLIC_CLASSES, ids=lambda k: k.__name__)
def test_every_public_method_and_property_has_a_docstring_of_its_own(klass):
    if issubclass(klass, BaseException):
        return  # (an error's methods are Exception's)
    missing = []
    for name in dir(klass):
        if name.startswith("_"):
            continue
        attribute = inspect.getattr_static(klass, name)
        member = callable(attribute) or isinstance(attribute, property | classmethod)
        if member and undocumented(klass, name):
            missing.append(name)
    assert not missing, f"{klass.__name__}: {missing}"


def test_help_of_compactlog_open_shows_open_with_its_arguments_and_errors():
    assert compactlog.open.__name__ == compactlog.open.__qualname__ == "open"
    doc = inspect.getdoc(compactlog.open)
    for word in ("path", "create", "read_only", "exclusive", "wait", "ConfigError", "raises"):
        assert word.lower() in doc.lower(), word


def test_every_error_of_compactlog_errors_is_importable_from_compactlog():
    errors = [
        name
        for name, value in vars(compactlog.errors).items()
        if inspect.isclass(value)
        and value.__module__ == compactlog.errors.__name__
        and issubclass(value, compactlog.CompactLogError | Warning)
    ]
    assert len(errors) > 20
    missing = [
        name
        for name in errors
        if getattr(compactlog, name, None) is not getattr(compactlog.errors, name)
    ]
    assert not missing
    assert not set(errors) - set(compactlog.__all__)
