"""The service's configuration: a TOML file, then environment variables, then flags.

Every value is checked here, once, before anything runs; an error names the key and where
it came from (the file, the environment variable or the flag), so ``--check`` in a deploy
pipeline says exactly what to fix. The file layout (every key optional)::

    roots = ["/var/lib/app/logs"]      # every subdirectory holding a log is cleaned
    logs = ["/srv/other/log"]          # explicit log directories
    workers = 2                        # passes running at once
    state_file = "/var/lib/app/logs/.compactlog-cleaner.json"
    log_format = "text"                # or "json"
    log_level = "info"

    [schedule]
    interval_seconds = 30              # cleaning rounds
    misfire_grace_seconds = 30
    forced_cron = "0 3 * * *"          # optional: forced passes (crontab syntax)
    retention_cron = "15 * * * *"      # optional: retention over every deleting log
    grace_seconds = 10                 # SIGTERM: how long running passes get to abort

    [throttle]
    io_bytes_per_second = 50_000_000   # shared by every worker; 0 = unthrottled

    [metrics]
    enabled = true
    address = "127.0.0.1"
    port = 9464                        # 0: any free port (written to the state file)

    [backoff]
    initial_seconds = 30               # a failing log waits this long, doubling per failure,
    max_seconds = 3600                 # up to this

    [[override]]                       # per-log or per-glob compaction/retention settings
    match = "orders-*"                 # fnmatch against the log's name or its path
    min_cleanable_dirty_ratio = 0.2

Overrides apply to the service's own passes and are never written into a log's ``meta``;
each is checked against the log's stored config by the rules of ``compactlog config set``
(``overrides.py``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from apscheduler.triggers.cron import CronTrigger

from compactlog.config import LogConfig
from compactlog.errors import ConfigError

DEFAULT_STATE_NAME = ".compactlog-cleaner.json"
SERVICE_LOCK_NAME = ".compactlog-cleaner.lock"

# Log settings an override may change: what compaction and retention read.
OVERRIDABLE = (
    "cleanup_policy",
    "min_cleanable_dirty_ratio",
    "min_compaction_lag_ms",
    "max_compaction_lag_ms",
    "delete_retention_ms",
    "retention_ms",
    "retention_bytes",
    "cleaner_buffer_bytes",
    "cleaner_io_bytes_per_second",
)

ENV_PREFIX = "COMPACTLOG_CLEANER_"


class CleanerConfigError(ConfigError):
    """A bad service setting: ``source`` is the file, variable or flag it came from."""

    def __init__(self, key: str, message: str, *, source: str) -> None:
        self.key = key
        self.source = source
        super().__init__(f"{source}: {key}: {message}")


@dataclass(frozen=True)
class Override:
    """Log settings for the logs whose name or path matches ``match`` (fnmatch)."""

    match: str
    settings: Mapping[str, Any]


@dataclass(frozen=True)
class ServiceConfig:
    """Everything the service needs, validated. See the module docstring for meanings."""

    roots: tuple[str, ...] = ()
    logs: tuple[str, ...] = ()
    workers: int = 2
    interval_seconds: float = 30.0
    misfire_grace_seconds: int = 30
    forced_cron: str | None = None
    retention_cron: str | None = None
    grace_seconds: float = 10.0
    io_bytes_per_second: int = 0
    metrics_enabled: bool = True
    metrics_address: str = "127.0.0.1"
    metrics_port: int = 9464
    backoff_initial_seconds: float = 30.0
    backoff_max_seconds: float = 3600.0
    state_file: str | None = None
    log_format: str = "text"
    log_level: str = "info"
    overrides: tuple[Override, ...] = ()
    source: str = "defaults"  # the file it was read from, for messages
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def state_path(self) -> str:
        """Where the state file goes: as configured, else in the first root."""
        if self.state_file:
            return os.path.abspath(self.state_file)
        if self.roots:
            return os.path.join(self.roots[0], DEFAULT_STATE_NAME)
        raise CleanerConfigError(
            "state_file", "needed when no root is configured", source=self.source
        )

    def overrides_for(self, name: str, path: str) -> dict[str, Any]:
        """The merged override settings for one log (later matches win)."""
        from fnmatch import fnmatch

        settings: dict[str, Any] = {}
        for override in self.overrides:
            if fnmatch(name, override.match) or fnmatch(path, override.match):
                settings.update(override.settings)
        return settings


# -- reading ------------------------------------------------------------------------------

_TOP = {"roots", "logs", "workers", "state_file", "log_format", "log_level"}
_SECTIONS: dict[str, dict[str, str]] = {
    # section -> {toml key: ServiceConfig field}
    "schedule": {
        "interval_seconds": "interval_seconds",
        "misfire_grace_seconds": "misfire_grace_seconds",
        "forced_cron": "forced_cron",
        "retention_cron": "retention_cron",
        "grace_seconds": "grace_seconds",
    },
    "throttle": {"io_bytes_per_second": "io_bytes_per_second"},
    "metrics": {"enabled": "metrics_enabled", "address": "metrics_address", "port": "metrics_port"},
    "backoff": {"initial_seconds": "backoff_initial_seconds", "max_seconds": "backoff_max_seconds"},
}

# environment variable suffix -> field
_ENV = {
    "ROOTS": "roots",
    "LOGS": "logs",
    "WORKERS": "workers",
    "INTERVAL": "interval_seconds",
    "GRACE": "grace_seconds",
    "IO_BYTES_PER_SECOND": "io_bytes_per_second",
    "METRICS_ADDRESS": "metrics_address",
    "METRICS_PORT": "metrics_port",
    "METRICS_ENABLED": "metrics_enabled",
    "STATE_FILE": "state_file",
    "LOG_FORMAT": "log_format",
    "LOG_LEVEL": "log_level",
    "FORCED_CRON": "forced_cron",
    "RETENTION_CRON": "retention_cron",
}


def load_file(path: str) -> ServiceConfig:
    """Read and validate a TOML file (no environment, no flags)."""
    source = os.path.abspath(path)
    try:
        with open(source, "rb") as handle:
            document = tomllib.load(handle)
    except FileNotFoundError:
        raise CleanerConfigError("(file)", "no such file", source=source) from None
    except tomllib.TOMLDecodeError as error:
        raise CleanerConfigError("(syntax)", f"not valid TOML: {error}", source=source) from None
    except OSError as error:
        raise CleanerConfigError("(file)", error.strerror or str(error), source=source) from None
    return from_document(document, source=source, base_dir=os.path.dirname(source))


def from_document(
    document: Mapping[str, Any], *, source: str, base_dir: str | None = None
) -> ServiceConfig:
    """Validate a parsed TOML document. Relative paths resolve against ``base_dir``."""
    values: dict[str, Any] = {}
    for key, value in document.items():
        if key in _TOP:
            values[key] = value
        elif key in _SECTIONS:
            if not isinstance(value, dict):
                raise CleanerConfigError(key, f"must be a table ([{key}])", source=source)
            known = _SECTIONS[key]
            for sub, sub_value in value.items():
                if sub not in known:
                    raise CleanerConfigError(
                        f"{key}.{sub}",
                        f"unknown key; known: {', '.join(sorted(known))}",
                        source=source,
                    )
                values[known[sub]] = sub_value
        elif key == "override":
            values["overrides"] = _overrides(value, source)
        else:
            known_keys = sorted([*_TOP, *_SECTIONS, "override"])
            raise CleanerConfigError(
                key, f"unknown key; known: {', '.join(known_keys)}", source=source
            )
    config = build(values, source=source, keys=_toml_keys(), base_dir=base_dir)
    return config


def _toml_keys() -> dict[str, str]:
    """field -> the key as written in the file, for messages."""
    names = {name: name for name in _TOP}
    for section, known in _SECTIONS.items():
        for key, name in known.items():
            names[name] = f"{section}.{key}"
    return names


def _overrides(value: Any, source: str) -> tuple[Override, ...]:
    if not isinstance(value, list):
        raise CleanerConfigError(
            "override", "must be an array of tables ([[override]])", source=source
        )
    result = []
    for i, table in enumerate(value):
        where = f"override[{i}]"
        if not isinstance(table, dict):
            raise CleanerConfigError(where, "must be a table", source=source)
        match = table.get("match")
        if not isinstance(match, str) or not match:
            raise CleanerConfigError(
                f"{where}.match", "a non-empty glob is required", source=source
            )
        settings = {k: v for k, v in table.items() if k != "match"}
        for key in settings:
            if key not in OVERRIDABLE:
                raise CleanerConfigError(
                    f"{where}.{key}",
                    f"not a compaction or retention setting; allowed: {', '.join(OVERRIDABLE)}",
                    source=source,
                )
        try:
            LogConfig().merged(settings)  # the library's own validation of every value
        except ConfigError as error:
            key = next((k for k in settings if str(error).startswith(k)), "?")
            raise CleanerConfigError(f"{where}.{key}", str(error), source=source) from None
        result.append(Override(match, dict(settings)))
    return tuple(result)


def from_environment(
    base: ServiceConfig, environ: Mapping[str, str] | None = None
) -> ServiceConfig:
    """Apply ``COMPACTLOG_CLEANER_*`` variables (containers) over ``base``."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}
    for suffix, name in _ENV.items():
        raw = environ.get(ENV_PREFIX + suffix)
        if raw is None or raw == "":
            continue
        keys[name] = ENV_PREFIX + suffix
        values[name] = _from_text(name, raw, ENV_PREFIX + suffix)
    if not values:
        return base
    return build(values, source="environment", keys=keys, base=base)


def _from_text(name: str, raw: str, key: str) -> Any:
    """An environment variable's text as the type the field wants."""
    if name in ("roots", "logs"):
        return [p for p in raw.replace(",", os.pathsep).split(os.pathsep) if p]
    if name == "metrics_enabled":
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise CleanerConfigError(key, f"must be true or false, not {raw!r}", source="environment")
    if name in ("workers", "metrics_port", "io_bytes_per_second"):
        try:
            return parse_size(raw) if name == "io_bytes_per_second" else int(raw)
        except ValueError:
            raise CleanerConfigError(
                key, f"must be an integer, not {raw!r}", source="environment"
            ) from None
    if name in ("interval_seconds", "grace_seconds"):
        try:
            return float(raw)
        except ValueError:
            raise CleanerConfigError(
                key, f"must be a number, not {raw!r}", source="environment"
            ) from None
    return raw


def parse_size(text: str) -> int:
    """``"50MB"``, ``"4MiB"``, ``"1000"`` -> bytes (decimal and binary units)."""
    units = {"": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2}
    units.update({"mib": 1024**2, "g": 1000**3, "gb": 1000**3, "gib": 1024**3})
    stripped = text.strip().lower().replace("_", "")
    digits = stripped.rstrip("abcdefghijklmnopqrstuvwxyz/")
    unit = stripped[len(digits) :].removesuffix("/s")
    if unit not in units or not digits:
        raise ValueError(text)
    return int(float(digits) * units[unit])


# -- validation ---------------------------------------------------------------------------


def build(
    values: Mapping[str, Any],
    *,
    source: str,
    keys: Mapping[str, str] | None = None,
    base: ServiceConfig | None = None,
    base_dir: str | None = None,
) -> ServiceConfig:
    """``base`` (defaults) with ``values`` applied, every value checked.

    ``keys`` maps a field to the name the user wrote (``schedule.interval_seconds``,
    ``COMPACTLOG_CLEANER_INTERVAL``, ``--interval``) so the error names that.
    """
    keys = keys or {}
    config = base or ServiceConfig(source=source)

    def fail(name: str, message: str) -> CleanerConfigError:
        return CleanerConfigError(keys.get(name, name), message, source=source)

    changes: dict[str, Any] = {}
    for name, value in values.items():
        if name in ("roots", "logs"):
            changes[name] = _paths(name, value, fail, base_dir)
        elif name == "overrides":
            changes[name] = value
        elif name in ("workers", "misfire_grace_seconds", "metrics_port", "io_bytes_per_second"):
            low = {"workers": 1, "misfire_grace_seconds": 1}.get(name, 0)
            if isinstance(value, bool) or not isinstance(value, int):
                raise fail(name, f"must be an integer, not {value!r}")
            if value < low or (name == "metrics_port" and value > 65535):
                top = " and at most 65535" if name == "metrics_port" else ""
                raise fail(name, f"must be at least {low}{top}, not {value}")
            changes[name] = value
        elif name in (
            "interval_seconds",
            "grace_seconds",
            "backoff_initial_seconds",
            "backoff_max_seconds",
        ):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise fail(name, f"must be a number of seconds, not {value!r}")
            if (value <= 0 and name != "grace_seconds") or value < 0:
                raise fail(name, f"must be positive, not {value}")
            changes[name] = float(value)
        elif name in ("forced_cron", "retention_cron"):
            if value is not None:
                if not isinstance(value, str):
                    raise fail(name, f"must be a crontab string, not {value!r}")
                try:
                    CronTrigger.from_crontab(value)
                except ValueError as error:
                    raise fail(name, f"not a valid crontab expression {value!r}: {error}") from None
            changes[name] = value
        elif name == "metrics_enabled":
            if not isinstance(value, bool):
                raise fail(name, f"must be true or false, not {value!r}")
            changes[name] = value
        elif name in ("metrics_address", "state_file"):
            if not isinstance(value, str) or not value:
                raise fail(name, f"must be a non-empty string, not {value!r}")
            if name == "state_file" and base_dir and not os.path.isabs(value):
                value = os.path.join(base_dir, value)
            changes[name] = value
        elif name == "log_format":
            if value not in ("text", "json"):
                raise fail(name, f"must be 'text' or 'json', not {value!r}")
            changes[name] = value
        elif name == "log_level":
            if not isinstance(value, str) or value.lower() not in (
                "debug",
                "info",
                "warning",
                "error",
            ):
                raise fail(name, f"must be debug, info, warning or error, not {value!r}")
            changes[name] = value.lower()
        else:  # pragma: no cover - the readers only pass known fields
            raise fail(name, "unknown setting")
    config = replace(config, **changes, source=source if base is None else config.source)
    initial = changes.get("backoff_initial_seconds", config.backoff_initial_seconds)
    if config.backoff_max_seconds < initial:
        raise fail("backoff_max_seconds", "must not be below backoff.initial_seconds")
    return config


def _paths(name: str, value: Any, fail: Any, base_dir: str | None) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise fail(name, f"must be a list of directory paths, not {value!r}")
    paths = []
    for item in value:
        if not isinstance(item, str) or not item:
            raise fail(name, f"every entry must be a non-empty path, not {item!r}")
        if base_dir and not os.path.isabs(item):
            item = os.path.join(base_dir, item)
        paths.append(os.path.abspath(item))
    return tuple(paths)


def check_usable(config: ServiceConfig) -> None:
    """What ``--check`` adds to parsing: something to clean, and roots that are directories."""
    if not config.roots and not config.logs:
        raise CleanerConfigError(
            "roots", "no root and no log configured: nothing to clean", source=config.source
        )
    if not config.roots and not config.state_file:
        raise CleanerConfigError(
            "state_file",
            "needed when only explicit logs are configured (it goes in the first root otherwise)",
            source=config.source,
        )
    for root in config.roots:
        if not os.path.isdir(root):
            raise CleanerConfigError("roots", f"{root} is not a directory", source=config.source)
