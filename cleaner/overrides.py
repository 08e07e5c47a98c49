"""The service's ``[[override]]`` rules: settings for its own passes, never stored.

An override is the service's policy for the logs it matches, not a property of those logs:
each pass runs with the log's stored config and the matching overrides on top (later rules
win), and the log's ``meta`` is never written. So ``compactlog config set`` stays the one
stored truth, and an operator's change is never undone by the service's next round.

Every rule goes through ``compactlog.config.check_change``, the gate of ``compactlog config
set`` and ``open(..., update_config=True)``: a rule that would change a log's
``cleanup_policy`` is refused the way ``config set`` refuses it. :func:`check_rules` does that
for every log found at ``--check`` and at start (a configuration error naming the log and the
rule); a log found later with a refused rule is reported and skipped (:func:`settings_for`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from fnmatch import fnmatch
from typing import Any

from compactlog.config import LogConfig, check_change
from compactlog.errors import ConfigError
from compactlog.storage.state_files import read_cleaner_state

from .config import CleanerConfigError, ServiceConfig
from .discovery import LogFacts, LogRef


def _matching(config: ServiceConfig, ref: LogRef) -> list[tuple[int, Mapping[str, Any]]]:
    """``(rule index, settings)`` of every rule matching the log's name or path, in order."""
    return [
        (i, rule.settings)
        for i, rule in enumerate(config.overrides)
        if fnmatch(ref.name, rule.match) or fnmatch(ref.path, rule.match)
    ]


def _where(config: ServiceConfig, index: int, ref: LogRef) -> str:
    return f"(match {config.overrides[index].match!r}) on log {ref.name} ({ref.path})"


def settings_for(config: ServiceConfig, ref: LogRef, stored: LogConfig) -> dict[str, Any]:
    """The override settings of one log (later rules win), each rule accepted by
    ``check_change`` against the log's stored config; else :class:`CleanerConfigError`
    naming the first refused rule, the log and why."""
    settings: dict[str, Any] = {}
    for index, rule in _matching(config, ref):
        try:
            check_change(stored, rule)
        except ConfigError as error:
            raise CleanerConfigError(
                f"override[{index}]", f"{_where(config, index, ref)}: {error}", source=config.source
            ) from None
        settings.update(rule)
    return settings


def check_rules(config: ServiceConfig, refs: list[LogRef], stored: Mapping[str, LogConfig]) -> None:
    """:func:`settings_for` on every log found (``stored``: their stored configs by path;
    a log missing there has an unreadable ``meta``, which the rounds report)."""
    for ref in refs:
        if ref.path in stored:
            settings_for(config, ref, stored[ref.path])


def apply(facts: LogFacts, settings: Mapping[str, Any], now_ms: int) -> LogFacts:
    """``facts`` judged by the stored config with ``settings`` on top (what the pass runs
    with): the config, and whether tombstones are due by the overridden retention."""
    if not settings or facts.config is None:
        return facts
    config = facts.config.merged(settings)
    due = facts.tombstones_due
    if config.delete_retention_ms != facts.config.delete_retention_ms:
        marks = read_cleaner_state(facts.ref.path).tombstone_marks
        due = any(m[1] + config.delete_retention_ms <= now_ms for m in marks)
    return dataclasses.replace(facts, config=config, tombstones_due=due)
