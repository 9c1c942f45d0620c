"""The command line, a mirror of the library: each command is a thin call of the `Registry` method of the same name,
one module per command group (each attached from its COMMANDS list, each built with common's `command`)."""
# This module defines the root group only (--db, --probation-min). Only the CLI raises click.ClickException;
# start-up imports neither torch, sentence-transformers nor faiss.
from __future__ import annotations

import os
import signal
import sys


def _interrupted_while_starting(signum, frame):   # (nothing is open yet: leaving at once loses nothing)
    sys.stderr.write("Error: interrupted while starting: nothing was done\n")
    os._exit(130)


# Ctrl-C while the command line loads its modules: one line and exit 130, not a traceback (main() then hands Ctrl-C
# to the commands, which say what they committed); only in the command's own process, never a library user's
if os.path.basename(sys.argv[0]) == "registry" or sys.argv[0].endswith(os.path.join("registry", "__main__.py")):
    signal.signal(signal.SIGINT, _interrupted_while_starting)

# numpy's BLAS on one thread (before numpy loads; a user's own setting wins): a command's products are small, and
# beside faiss's or torch's OpenMP pool its threads spun so that a 31 x 12,032 product took 1.7 s instead of 10 ms
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import importlib  # noqa: E402

import click  # noqa: E402

from registry.cli.common import emit_json, handles_errors, interrupted, open_registry, table  # noqa: E402
from registry.core import settings  # noqa: E402
from registry.core.errors import RegistryError  # noqa: E402
from registry.core.interrupts import forget_sigint, raise_interrupt  # noqa: E402

__all__ = ["cli", "main", "emit_json", "handles_errors", "open_registry", "table"]

# Each command module's COMMANDS, by name: a command's process imports its own module, not all eleven (a tenth of
# `registry similar`'s start-up); tests/test_cli_docs.py holds this to the modules' lists.
COMMANDS_BY_MODULE = {
    "db": ("db",),
    "data": ("import", "export", "vectors", "draw-splits"),
    "models": ("models", "show", "stats", "register", "probe", "onboard", "history", "diff"),
    "tidying": ("delete", "rename"),
    "encoders": ("encoders", "train", "evaluate"),
    "geometry": ("similar", "fingerprint", "portfolio", "fallback", "map", "geometry"),
    "routing": ("route", "log", "mark-unavailable", "mark-available"),
    "serving": ("serve", "endpoints"),
    "asking": ("ask", "prompt"),
    "verify": ("verify", "watch"),
    "feedback": ("feedback", "feedback-source", "drift"),
}
_MODULE_OF = {name: module for module, names in COMMANDS_BY_MODULE.items() for name in names}


class RegistryGroup(click.Group):
    """The root group: Ctrl-C anywhere outside a command's own handling (`handles_errors`) is one line and exit 130,
    not click's "Aborted!" and exit 1. Its commands are attached from their module when first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_MODULE_OF)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in _MODULE_OF:
            for command in importlib.import_module(f"registry.cli.{_MODULE_OF[cmd_name]}").COMMANDS:
                self.add_command(command)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise interrupted() from None


@click.group(cls=RegistryGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", default=None,
              help="The registry's DuckDB file, or a PostgreSQL URL postgresql://user@host:port/dbname "
                   "(default: $REGISTRY_DB, else registry.duckdb).")
@click.option("--probation-min", type=click.IntRange(min=0), default=None,
              help="Fewest evaluations behind a model's embedding for routing to choose it unasked (default: the "
                   "smaller of 500 and half the median count behind the best-known embeddings, those holding half "
                   "the evaluations; or set REGISTRY_PROBATION_MIN).")
@click.version_option(package_name="locus-registry", prog_name="registry")
@click.pass_context
def cli(ctx: click.Context, db: str | None, probation_min: int | None) -> None:
    """A model registry for LLMs: import benchmark results, embed models with LOCUS, compare and route."""
    # the environment's defaults are read where every other setting is (core/settings.py), not by click
    try:
        env = settings.current()
    except RegistryError as exc:
        raise click.ClickException(str(exc)) from None
    ctx.obj = {"db": db or env.db, "registry": None, "probation_min": probation_min}


def quiet_interrupt(unraisable) -> None:
    """Python's hook for an exception it cannot raise (one in a garbage collector's callback): Ctrl-C there is not
    printed as a traceback, the command says it was interrupted (interrupts.sigint_seen); any other, as Python would."""
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        sys.__unraisablehook__(unraisable)


def main() -> None:
    forget_sigint()
    sys.unraisablehook = quiet_interrupt
    signal.signal(signal.SIGINT, raise_interrupt)      # from here Ctrl-C is KeyboardInterrupt (and noted)
    try:
        cli(prog_name="registry")
    except SystemExit as exc:
        # an interrupt said and exited 130 for: CPython 3.11 remembers a KeyboardInterrupt once raised through code
        # it ran from a string (a dataclass's generated methods, say) and would end the process by SIGINT at exit
        # whatever the exit code; the command has closed what it opened, so it leaves now, with 130
        if exc.code == 130:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        raise


if __name__ == "__main__":
    main()
