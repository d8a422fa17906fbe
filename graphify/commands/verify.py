"""`graphify verify SCRIPT [--steps N] [--json] [-- SCRIPT ARGS...]`; `register(cli)` adds it to a click group.

Exit codes: 0 the rewrite is equivalent, 1 it is not (or the rewritten script failed), 2 it could not
be verified (the original failed, nothing to rewrite, bad arguments).
"""

from __future__ import annotations

import json
import sys

import click


@click.command("verify", short_help="Run a script and its rewrite side by side: same training, and how much faster.")
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT_ARGS]...")
@click.option(
    "--steps",
    type=click.IntRange(min=1),
    help="Training steps to run each version for (default 50; a loop that may be entered again runs until its second entry, up to 300).",
)
@click.option(
    "--rtol",
    type=click.FloatRange(min=0),
    help="Relative tolerance on losses and on the state per step's update (default: 0 on the CPU, by precision on CUDA).",
)
@click.option("--atol", type=click.FloatRange(min=0), help="Absolute tolerance on losses (default: 0 on the CPU, by precision on CUDA).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (schema: docs/verify.md).")
@click.option(
    "--profile/--no-profile", default=True, show_default=True, help="Profile the last 5 steps on CUDA (kernels, launch overhead)."
)
@click.option(
    "--time-split/--no-time-split",
    default=True,
    show_default=True,
    help="Split each run's time: start-up, data wait, host-to-device copies, step, host reads, evaluation, rest.",
)
@click.option("--timeout", type=click.FloatRange(min=1), help="Seconds each version may run.")
@click.option("--keep", is_flag=True, help="Keep the instrumented scripts and their output; print where.")
@click.option(
    "--rewritten", type=click.Path(dir_okay=False), help="Verify this rewrite of SCRIPT (edited by hand, or older) instead of graphify's."
)
def verify_command(script, script_args, steps, rtol, atol, as_json, profile, time_split, timeout, keep, rewritten) -> None:
    """Run SCRIPT and its `graphify rewrite` side by side and check they train the same.

    Both run STEPS steps of the rewritten loop with the same seeds, the rewrite on the original's
    trajectory: each step starts from the original's state after the step before, and its losses and
    resulting state are compared. On CUDA the step time, setup time, memory and launch overhead are
    reported, and where each run's time goes (data wait, copies, the step...) with the most capture can
    save. Arguments after `--` go to the script.
    """
    from rich.console import Console

    from graphify.config import ConfigError, load_settings
    from graphify.verify import verify_file
    from graphify.verify.display import Progress, render

    if script.endswith(".ipynb"):
        click.echo(f"graphify: {script}: verify runs scripts; export the notebook first (`jupyter nbconvert --to script`)", err=True)
        sys.exit(2)
    try:
        settings = load_settings([script])
    except ConfigError as exc:
        click.echo(f"graphify: error: {exc}", err=True)
        sys.exit(2)
    err = Console(stderr=True)
    live = err.is_terminal
    progress = Progress(err) if live else None
    try:
        if progress is not None:
            progress.__enter__()
        report = verify_file(
            script,
            steps,
            list(script_args),
            rtol,
            atol,
            settings=settings,
            profile=profile,
            time_split=time_split,
            timeout=timeout,
            keep=keep,
            progress=progress,
            rewritten=rewritten,
        )
    finally:
        if progress is not None:
            progress.__exit__(None, None, None)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        render(report, Console(), errors=err)
    sys.exit(report.exit_code)


def register(cli_group: click.Group) -> None:
    cli_group.add_command(verify_command)
