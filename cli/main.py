"""``compactlog``: the operator CLI (jlogctl plus Kafka's log tools).

Commands are registered by name in :data:`COMMANDS` and imported only when used, so
``compactlog --help`` stays fast and later command groups (snapshots, the cleaner service,
Spark restores) slot in with one line each. Every command module imports the library lazily.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from .output import EXIT_INTERRUPTED, EXIT_PROBLEM, EXIT_USAGE, CliError, error_line

# name -> "module:attribute"; a module per command group.
COMMANDS: dict[str, str] = {
    "create": "compactlog.cli.commands_log:create",
    "meta": "compactlog.cli.commands_log:meta",
    "config": "compactlog.cli.commands_log:config",
    "subscribers": "compactlog.cli.commands_subscribers:subscribers",
    "segments": "compactlog.cli.commands_data:segments",
    "dump": "compactlog.cli.commands_data:dump",
    "tail": "compactlog.cli.commands_data:tail",
    "get": "compactlog.cli.commands_data:get",
    "stats": "compactlog.cli.commands_data:stats",
    "verify": "compactlog.cli.commands_check:verify",
    "repair": "compactlog.cli.commands_check:repair",
    "compact": "compactlog.cli.commands_maintenance:compact",
    "retention": "compactlog.cli.commands_maintenance:retention",
    "demo": "compactlog.cli.commands_demo:demo",
    "cleaner": "compactlog.cli.commands_cleaner:cleaner",
    "archive": "compactlog.cli.commands_archive:archive",
    **{name: f"compactlog.cli.commands_spark:{name}" for name in ("snapshot", "restore")},
}

# Usage errors raised inside commands that click did not see as such (ConfigError, ...).
_USAGE_ERRORS = ("ConfigError", "SubscriberError")


class LazyGroup(click.Group):
    """A group whose commands are imported on first use."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*self.lazy, *super().list_commands(ctx)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy:
            module_name, attribute = self.lazy[cmd_name].split(":")
            return getattr(importlib.import_module(module_name), attribute)
        return super().get_command(ctx, cmd_name)


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="compactlog", prog_name="compactlog")
def cli() -> None:
    """Operate compactlog logs: inspect, verify, repair, compact, follow.

    Every command takes the log directory as PATH, prints aligned tables for people and
    JSON with --json for scripts, and exits 0 on success, 1 when it found a problem, 2 on
    bad usage. Read-only commands never block writers; compact, retention and subscriber
    changes run beside live writers; only repair and config changes writers cannot pick up
    refuse while a writer has the log open (unless --force), saying why.

    \b
    Examples:
      compactlog demo                       # build ./demo-data/log and summarize it
      compactlog meta ./demo-data/log
      compactlog verify ./demo-data/log --json
      compactlog dump ./demo-data/log --limit 5
      compactlog subscribers list ./demo-data/log
    """


def _interrupted() -> str:
    """The line of a command Ctrl-C (SIGINT) stopped: the log it worked on, and why that
    is safe (every change the library makes is crash-safe, and a stop part-way is no worse
    than a crash)."""
    from .common import WORKING_ON

    where = f"{WORKING_ON[-1]}: " if WORKING_ON else ""
    return (
        f"{where}interrupted by Ctrl-C (SIGINT) before the command finished; the log is "
        "safe: it recovers as from a crash, losing nothing acknowledged"
    )


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the CLI, turn every failure into one line and an exit code."""
    try:
        result = cli.main(args=argv, prog_name="compactlog", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as error:
        click.echo(error.ctx.get_help())
        sys.exit(EXIT_USAGE)
    except click.UsageError as error:
        where = error.ctx.command_path if error.ctx is not None else "compactlog"
        error_line(f"{error.format_message()} (see '{where} --help')")
        sys.exit(EXIT_USAGE)
    except CliError as error:
        error.show()
        sys.exit(error.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):  # (click turns Ctrl-C into Abort)
        error_line(_interrupted())
        sys.exit(EXIT_INTERRUPTED)
    except BrokenPipeError:
        _quiet_broken_pipe()
        sys.exit(0)
    except Exception as error:  # library errors and OS errors: one line, exit 1
        if os.environ.get("COMPACTLOG_DEBUG"):
            raise
        sys.exit(_report(error))
    if isinstance(result, int) and not isinstance(result, bool):
        sys.exit(result)
    sys.exit(0)


def _report(error: Exception) -> int:
    try:
        from compactlog.errors import CompactLogError
    except ImportError:  # pragma: no cover
        CompactLogError = ()  # type: ignore[assignment]
    if isinstance(error, CompactLogError):
        error_line(str(error))
        return EXIT_USAGE if type(error).__name__ in _USAGE_ERRORS else EXIT_PROBLEM
    if isinstance(error, OSError):
        where = f"{error.filename}: " if error.filename else ""
        error_line(f"{where}{error.strerror or error}")
        return EXIT_PROBLEM
    error_line(f"unexpected {type(error).__name__}: {error}")
    return EXIT_PROBLEM


def _quiet_broken_pipe() -> None:
    """``compactlog dump ... | head``: stop quietly when the reader goes away."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


if __name__ == "__main__":  # pragma: no cover
    main()
