"""``compactlog cleaner status``: what the cleaner service is doing, from its state file.

The service rewrites its state file after every round and pass (``compactlog.cleaner.state``),
so this needs no HTTP and works where the metrics port is closed. Exit code 0 when the
service runs (or, after ``compactlog-cleaner --once``, its round finished without a failed
or uncleanable log) and every log is healthy; 1 when it is not running, the last ``--once``
round failed, or some log is uncleanable or failing (scripts, cron and health checks can
use it); 2 when no state file can be found.
"""

from __future__ import annotations

import os
import time
from typing import Any

import click

from .output import CliError, UsageProblem, emit_json, human_bytes, print_fields, print_table

STATE_NAME = ".compactlog-cleaner.json"  # compactlog.cleaner.config.DEFAULT_STATE_NAME


@click.group()
def cleaner() -> None:
    """Look at the cleaner service (compactlog-cleaner) running on this machine.

    \b
    Examples:
      compactlog cleaner status /var/lib/app/logs          # a root the service cleans
      compactlog cleaner status ./state.json --json         # or its state file
    """


def _state_path(where: str | None) -> str:
    if where is None:
        where = os.environ.get("COMPACTLOG_CLEANER_STATE_FILE")
    if where is None:
        roots = os.environ.get("COMPACTLOG_CLEANER_ROOTS", "")
        first = next((p for p in roots.replace(",", os.pathsep).split(os.pathsep) if p), None)
        where = first
    if where is None:
        raise UsageProblem(
            "say where the service runs: a root directory or its state file "
            "(or set COMPACTLOG_CLEANER_STATE_FILE)"
        )
    path = os.path.abspath(where)
    return os.path.join(path, STATE_NAME) if os.path.isdir(path) else path


def _liveness(document: dict[str, Any]) -> tuple[bool, str]:
    """``(healthy, text)``. A ``--once`` run (cron) is healthy when it finished and its
    round had no failed or uncleanable log; a service, when its process is alive."""
    from compactlog.storage.lockfile import pid_alive

    pid = document.get("pid")
    last = document.get("last_round")
    if document.get("mode") == "once" and document.get("phase") == "stopped":
        if not last:
            return False, f"--once run (pid {pid}) stopped before finishing its round"
        text = (
            f"--once run finished {_ago(last['finished_at'])}: {last['passes']} pass(es), "
            f"{last['cleaned']} cleaned"
        )
        if last["problems"]:
            return False, f"{text}; failed: {', '.join(last['problems'])}"
        return True, f"{text}; ok"
    if document.get("phase") == "stopped":
        return False, f"stopped (pid {pid})"
    if not isinstance(pid, int) or not pid_alive(pid):
        return False, f"not running (pid {pid} is gone; the state file is from its last run)"
    age = time.time() - float(document.get("updated_at") or 0)
    return True, f"running (pid {pid}, state updated {age:.0f}s ago)"


@cleaner.command()
@click.argument("where", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the state file, plus liveness).")
def status(where: str | None, as_json: bool) -> int:
    """Show the service's state: liveness (or the last --once round's result), rounds, and
    every log's dirty ratio, size, last clean, failures and uncleanable reason.

    Exit code 0 when the service runs, or its last --once run succeeded, and no log is
    failing or uncleanable; 1 otherwise (a cron health check).

    WHERE is a root the service cleans (its state file is ROOT/.compactlog-cleaner.json) or
    the state file itself; by default $COMPACTLOG_CLEANER_STATE_FILE or the first of
    $COMPACTLOG_CLEANER_ROOTS.
    """
    from compactlog.cleaner.state import read_state

    path = _state_path(where)
    try:
        document = read_state(path)
    except FileNotFoundError:
        raise UsageProblem("no cleaner state file here (has the service run?)", path=path) from None
    except ValueError as error:
        raise CliError(str(error), path=path) from None
    alive, liveness = _liveness(document)
    logs = document.get("logs", {})
    unhealthy = [p for p, s in logs.items() if s.get("uncleanable") or s.get("failures")]
    if as_json:
        emit_json({**document, "state_file": path, "running": alive, "liveness": liveness})
    else:
        metrics = document.get("metrics")
        print_fields(
            [
                ("service", liveness),
                ("state file", path),
                ("config", document.get("config")),
                ("roots", ", ".join(document.get("roots", [])) or "-"),
                (
                    "metrics",
                    f"http://{metrics['address']}:{metrics['port']}/metrics" if metrics else "off",
                ),
                ("rounds", document.get("rounds")),
                ("passes running", document.get("passes_running")),
                ("queue", document.get("queue")),
                ("errors", document.get("errors")),
            ],
            title="compactlog-cleaner",
        )
        rows = []
        for state in logs.values():
            last = state.get("last_clean_at")
            running = state.get("running")
            problem = state.get("uncleanable") or state.get("last_error") or ""
            rows.append(
                [
                    state.get("name"),
                    state.get("policy"),
                    state.get("segments"),
                    human_bytes(state.get("bytes")),
                    f"{state['dirty_ratio']:.3f}" if state.get("dirty_ratio") is not None else None,
                    _ago(last) if last else "never",
                    "running" if running else (state.get("last_pass") or {}).get("status", "-"),
                    state.get("failures"),
                    problem[:80] or None,
                ]
            )
        print_table(
            [
                "log",
                "policy",
                "segments",
                "size",
                "dirty",
                "last clean",
                "state",
                "failures",
                "problem",
            ],
            rows,
            title=f"{len(rows)} log(s)",
            right=["segments", "size", "dirty", "failures"],
        )
    return 0 if alive and not unhealthy else 1


def _ago(when: float) -> str:
    seconds = max(0.0, time.time() - when)
    if seconds < 120:
        return f"{seconds:.0f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"
