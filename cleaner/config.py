"""The service's configuration: a TOML file, then environment variables, then flags.

Every value is checked here, once, before anything runs; every problem is reported at
once (:class:`CleanerConfigErrors`), each naming the key and where it came from (the file,
the environment variable or the flag) with a "did you mean" for a misspelled name, so
``--check`` in a deploy pipeline says exactly what to fix. The file layout (every key optional)::

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

    [archive]                          # optional: archive every log to object storage
    url = "s3://bucket/prefix"         # each log goes to <url>/<its name> (docs/archive.md)
    interval_seconds = 1               # archiving rounds
    retention_seconds = 604800         # restore window (7 days); 0 keeps the newest only
    lag_threshold_seconds = 300        # /readyz is unready while a log's archive lags more
    [archive.logs]                     # per log or glob: its own URL ("" = not archived)
    "orders-*" = "s3://other-bucket/orders"

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
from compactlog.errors import ConfigError, did_you_mean

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


def _where(key: str, source: str) -> str:
    """How a message names a setting: ``flag --root``, ``environment variable
    COMPACTLOG_CLEANER_ROOTS``, ``roots (default)`` or ``<file>: roots``."""
    if source == "command line":
        return f"flag {key}"
    if source == "environment":
        return f"environment variable {key}"
    if source == "defaults":
        return f"{key} (default)"
    return f"{source}: {key}"


class CleanerConfigError(ConfigError):
    """A bad service setting: ``source`` is the file, variable or flag it came from."""

    def __init__(self, key: str, message: str, *, source: str) -> None:
        self.key = key
        self.source = source
        self.problems: list[CleanerConfigError] = [self]
        super().__init__(f"{_where(key, source)}: {message}")


class CleanerConfigErrors(CleanerConfigError):
    """Several bad settings, all reported at once (``problems``, in the order found)."""

    def __init__(self, problems: Sequence[CleanerConfigError]) -> None:
        self.key, self.source = problems[0].key, problems[0].source
        self.problems = [p for problem in problems for p in problem.problems]
        ConfigError.__init__(
            self,
            f"{len(self.problems)} problems:\n" + "\n".join(f"  {p}" for p in self.problems),
        )


def raise_all(problems: Sequence[CleanerConfigError]) -> None:
    """Raise the one problem, or all of them together; nothing when there is none."""
    flat = [p for problem in problems for p in problem.problems]
    if len(flat) == 1:
        raise flat[0]
    if flat:
        raise CleanerConfigErrors(flat)


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
    archive_url: str | None = None
    archive_urls: tuple[tuple[str, str], ...] = ()  # (glob, URL or "") per log
    archive_interval_seconds: float = 1.0
    archive_retention_seconds: float = 7 * 86_400.0
    archive_lag_threshold_seconds: float = 300.0
    source: str = "defaults"  # the file it was read from, for messages
    extra: dict[str, Any] = field(default_factory=dict)
    # field -> (source, key as the user wrote it) of every setting not left at its default
    origins: Mapping[str, tuple[str, str]] = field(default_factory=dict, compare=False)

    def error(self, name: str, message: str) -> CleanerConfigError:
        """An error about field ``name``, naming where its value came from."""
        source, key = self.origins.get(name, (self.source, name))
        return CleanerConfigError(key, message, source=source)

    @property
    def metrics_requested(self) -> bool:
        """Whether a file, variable or flag asked for metrics (``--once`` serves none
        unless asked)."""
        return self.metrics_enabled and any(
            name in self.origins for name in ("metrics_enabled", "metrics_port", "metrics_address")
        )

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

    def archive_url_for(self, name: str, path: str) -> str | None:
        """Where a log is archived: the last ``[archive.logs]`` glob matching its name or
        path, else ``<archive.url>/<name>``; ``None``: not archived."""
        from fnmatch import fnmatch

        chosen: str | None = None
        for pattern, url in self.archive_urls:
            if fnmatch(name, pattern) or fnmatch(path, pattern):
                chosen = url
        if chosen is not None:
            return chosen or None
        return f"{self.archive_url.rstrip('/')}/{name}" if self.archive_url else None

    @property
    def archiving(self) -> bool:
        return bool(self.archive_url) or any(url for _glob, url in self.archive_urls)

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
    "archive": {
        "url": "archive_url",
        "logs": "archive_urls",
        "interval_seconds": "archive_interval_seconds",
        "retention_seconds": "archive_retention_seconds",
        "lag_threshold_seconds": "archive_lag_threshold_seconds",
    },
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
    "ARCHIVE_URL": "archive_url",
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
    problems: list[CleanerConfigError] = []
    all_keys = [*_TOP, *_SECTIONS, "override", *_toml_keys().values()]
    for key, value in document.items():
        if key in _TOP:
            values[key] = value
        elif key in _SECTIONS:
            if not isinstance(value, dict):
                problems.append(
                    CleanerConfigError(key, f"must be a table ([{key}])", source=source)
                )
                continue
            known = _SECTIONS[key]
            for sub, sub_value in value.items():
                if sub not in known:
                    problems.append(
                        CleanerConfigError(
                            f"{key}.{sub}",
                            f"unknown key (known: {', '.join(sorted(known))})"
                            + did_you_mean(sub, known),
                            source=source,
                        )
                    )
                    continue
                values[known[sub]] = sub_value
        elif key == "override":
            try:
                values["overrides"] = _overrides(value, source)
            except CleanerConfigError as error:
                problems.append(error)
        else:
            known_keys = sorted([*_TOP, *_SECTIONS, "override"])
            problems.append(
                CleanerConfigError(
                    key,
                    f"unknown key (known: {', '.join(known_keys)})" + did_you_mean(key, all_keys),
                    source=source,
                )
            )
    try:
        config = build(values, source=source, keys=_toml_keys(), base_dir=base_dir)
    except CleanerConfigError as error:
        problems.append(error)
    raise_all(problems)
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
                    f"not a compaction or retention setting; allowed: {', '.join(OVERRIDABLE)}"
                    + did_you_mean(key, ["match", *OVERRIDABLE]),
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
    problems: list[CleanerConfigError] = []
    known = [ENV_PREFIX + suffix for suffix in _ENV]
    for variable in sorted(environ):
        if variable.startswith(ENV_PREFIX) and variable not in known and environ[variable]:
            problems.append(
                CleanerConfigError(
                    variable,
                    "unknown variable (known: "
                    + ", ".join(known)
                    + ")"
                    + did_you_mean(variable, known),
                    source="environment",
                )
            )
    for suffix, name in _ENV.items():
        raw = environ.get(ENV_PREFIX + suffix)
        if raw is None or raw == "":
            continue
        keys[name] = ENV_PREFIX + suffix
        try:
            values[name] = _from_text(name, raw, ENV_PREFIX + suffix)
        except CleanerConfigError as error:
            problems.append(error)
    config = layer(values, source="environment", keys=keys, base=base, problems=problems)
    raise_all(problems)
    return config


def layer(
    values: Mapping[str, Any],
    *,
    source: str,
    keys: Mapping[str, str],
    base: ServiceConfig,
    problems: list[CleanerConfigError],
) -> ServiceConfig:
    """``base`` with one source's ``values`` applied (:func:`build`); on problems, ``base``
    unchanged and the problems added to ``problems`` (reported with the other sources')."""
    if not values:
        return base
    try:
        return build(values, source=source, keys=keys, base=base)
    except CleanerConfigError as error:
        problems.append(error)
        return base


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
    problems: list[CleanerConfigError] = []
    for name, value in values.items():
        try:
            changes[name] = _checked(name, value, fail, base_dir)
        except CleanerConfigError as error:
            problems.append(error)
    origins = dict(config.origins)
    origins.update((name, (source, keys.get(name, name))) for name in changes)
    config = replace(
        config, **changes, source=source if base is None else config.source, origins=origins
    )
    initial = changes.get("backoff_initial_seconds", config.backoff_initial_seconds)
    if config.backoff_max_seconds < initial:
        problems.append(fail("backoff_max_seconds", "must not be below backoff.initial_seconds"))
    raise_all(problems)
    return config


def _checked(name: str, value: Any, fail: Any, base_dir: str | None) -> Any:
    """``value`` of field ``name`` as the config holds it; raises ``fail(name, why)``."""
    if name in ("roots", "logs"):
        return _paths(name, value, fail, base_dir)
    if name == "overrides":
        return value
    if name == "archive_url":
        if value is not None and (not isinstance(value, str) or "://" not in value):
            raise fail(
                name, f"must be an archive URL (s3://, gs://, az://, file:///), not {value!r}"
            )
        return value or None
    if name == "archive_urls":
        if not isinstance(value, Mapping):
            raise fail(name, f"must be a table of glob = URL, not {value!r}")
        for pattern, url in value.items():
            if not isinstance(url, str) or (url and "://" not in url):
                raise fail(name, f'{pattern!r} must map to an archive URL or "", not {url!r}')
        return tuple((str(k), str(v)) for k, v in value.items())
    if name in (
        "archive_interval_seconds",
        "archive_retention_seconds",
        "archive_lag_threshold_seconds",
    ):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise fail(name, f"must be a number of seconds, not {value!r}")
        if value < 0 or (value == 0 and name == "archive_interval_seconds"):
            raise fail(
                name, f"must be {'positive' if 'interval' in name else 'at least 0'}, not {value}"
            )
        return float(value)
    if name in ("workers", "misfire_grace_seconds", "metrics_port", "io_bytes_per_second"):
        low = {"workers": 1, "misfire_grace_seconds": 1}.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail(name, f"must be an integer, not {value!r}")
        if value < low or (name == "metrics_port" and value > 65535):
            top = " and at most 65535" if name == "metrics_port" else ""
            raise fail(name, f"must be at least {low}{top}, not {value}")
        return value
    if name in (
        "interval_seconds",
        "grace_seconds",
        "backoff_initial_seconds",
        "backoff_max_seconds",
    ):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise fail(name, f"must be a number of seconds, not {value!r}")
        if (value <= 0 and name != "grace_seconds") or value < 0:
            raise fail(name, f"must be positive, not {value}")
        return float(value)
    if name in ("forced_cron", "retention_cron"):
        if value is not None:
            if not isinstance(value, str):
                raise fail(name, f"must be a crontab string, not {value!r}")
            try:
                CronTrigger.from_crontab(value)
            except ValueError as error:
                raise fail(name, f"not a valid crontab expression {value!r}: {error}") from None
        return value
    if name == "metrics_enabled":
        if not isinstance(value, bool):
            raise fail(name, f"must be true or false, not {value!r}")
        return value
    if name in ("metrics_address", "state_file"):
        if not isinstance(value, str) or not value:
            raise fail(name, f"must be a non-empty string, not {value!r}")
        if name == "state_file" and base_dir and not os.path.isabs(value):
            value = os.path.join(base_dir, value)
        return value
    if name == "log_format":
        if value not in ("text", "json"):
            raise fail(name, f"must be 'text' or 'json', not {value!r}")
        return value
    if name == "log_level":
        if not isinstance(value, str) or value.lower() not in ("debug", "info", "warning", "error"):
            raise fail(name, f"must be debug, info, warning or error, not {value!r}")
        return value.lower()
    raise fail(name, "unknown setting")  # pragma: no cover - the readers pass known fields


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
    """What ``--check`` adds to parsing: something to clean, and roots that are directories.
    Each problem names where the setting came from (``flag --root``, a variable, the file)."""
    problems: list[CleanerConfigError] = []
    if not config.roots and not config.logs:
        problems.append(config.error("roots", "no root and no log configured: nothing to clean"))
    elif not config.roots and not config.state_file:
        problems.append(
            config.error(
                "state_file",
                "needed when only explicit logs are configured (it goes in the first root "
                "otherwise)",
            )
        )
    for root in config.roots:
        if not os.path.isdir(root):
            problems.append(config.error("roots", f"{root} is not a directory"))
    raise_all(problems)
