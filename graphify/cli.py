"""Command line: the click group and its commands, each in graphify/commands/: `graphify check`,
`graphify rules`, `graphify rule CODE`, `graphify rewrite` and `graphify verify`.

Start-up matters (pre-commit runs `check` on a handful of files): registering the commands imports click
alone; the analysis (libcst), the rule registry and pathspec are imported only by the code paths that need them.
"""

from __future__ import annotations

from typing import Sequence

import click

from graphify import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="graphify")
def cli() -> None:
    """Find CUDA-graph breakers in PyTorch training loops, and rewrite the loops to capture their steps.

    `graphify COMMAND --help` tells more of each command.
    """


def main(argv: Sequence[str] | None = None) -> None:
    cli.main(args=list(argv) if argv is not None else None, prog_name="graphify")


# --- check ---------------------------------------------------------------------------------------
from graphify.commands.check import register as _register_check  # noqa: E402  (click only; the work is imported lazily)

_register_check(cli)

# --- rules / rule --------------------------------------------------------------------------------
from graphify.commands.rules import register as _register_rules  # noqa: E402  (click only; the registry is imported lazily)

_register_rules(cli)

# --- rewrite -------------------------------------------------------------------------------------
from graphify.commands.rewrite import register as _register_rewrite  # noqa: E402  (click only; the work is imported lazily)

_register_rewrite(cli)

# --- verify --------------------------------------------------------------------------------------
from graphify.commands.verify import register as _register_verify  # noqa: E402  (click only; the work is imported lazily)

_register_verify(cli)
