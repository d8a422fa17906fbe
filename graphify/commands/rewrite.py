"""`graphify rewrite PATHS [--in-place] [--check] [--verify]` (or `-`, standard input); `register(cli)` adds it
to a click group."""

from __future__ import annotations

import os
import sys

import click


@click.command("rewrite", short_help="Rewrite loops into warmup, capture and replay (a diff; --in-place writes).")
@click.argument("paths", nargs=-1, type=click.Path(readable=False))  # an unreadable file is one error line
@click.option("--in-place", is_flag=True, help="Write the rewritten files (atomically) instead of printing a diff.")
@click.option("--check", "check_only", is_flag=True, help="Exit 1 if any loop could be captured but is not yet (for CI and pre-commit).")
@click.option("--verify", is_flag=True, help="With --in-place: write a file only if `graphify verify` passes on it.")
@click.option("--steps", type=click.IntRange(min=1), default=30, show_default=True, help="Steps `--verify` runs.")
@click.option("--select", metavar="CODES", help="As for `graphify check`.")
@click.option("--ignore", metavar="CODES", help="As for `graphify check`.")
@click.option("--force-exclude", is_flag=True, help="Apply exclude / extend-exclude to files named on the command line too (pre-commit).")
@click.option(
    "--runtime",
    type=click.Choice(["import", "inline", "vendor"]),
    default="import",
    show_default=True,
    help="How rewritten files get CapturedStep: import graphify.runtime, paste it into each file, or import one copy "
    "written for the project (--vendor-path).",
)
@click.option(
    "--vendor-path",
    type=click.Path(dir_okay=False),
    default="graphify_runtime.py",
    show_default=True,
    help="With --runtime vendor: the module written (with --in-place) and imported by its name; keep it where the scripts import from.",
)
@click.option(
    "--defer-host-reads/--no-defer-host-reads",
    default=None,
    help="Host reads after the replay that only log (`print(loss.item())`, meters, appends) run one step later, with the "
    "same values, so the host queues the next replay before it waits; the lines print one step later. Default: off, or "
    "defer-host-reads in [tool.graphify].",
)
@click.option(
    "--stdin-filename", metavar="PATH", help="The path standard input (`-`) is rewritten as: its settings, and a notebook by its suffix."
)
def rewrite_command(
    paths, in_place, check_only, verify, steps, select, ignore, force_exclude, runtime, vendor_path, defer_host_reads, stdin_filename
) -> None:
    """Rewrite eligible training and inference loops of PATHS into warmup, capture and replay.

    Prints a unified diff and changes nothing unless --in-place is given; `-` reads standard input and
    writes the rewritten source to standard output. Loops that cannot be captured are left as they are,
    with the reason. Exit codes: 0 nothing to change, 1 files would change or changed (or, with --check,
    a loop is not captured yet; or --verify failed), 2 usage error or a file not read or rewritten.
    """
    from graphify.files import discover, named_files
    from graphify.commands.rewrite_files import rewrite_files, vendor_runtime, vendor_target_problem

    if verify and not in_place:
        raise click.UsageError("--verify only applies with --in-place")
    if "-" in paths and (len(paths) > 1 or in_place):
        raise click.UsageError("`-` (standard input) is rewritten alone, to standard output: no other path, no --in-place")
    choice = _runtime_choice(runtime, vendor_path)
    paths = paths or (".",)
    settings = _settings([stdin_filename or "."] if paths == ("-",) else paths, select, ignore, defer_host_reads)
    if paths == ("-",):
        sys.exit(_rewrite_stdin(stdin_filename or "-", settings, check_only, choice))
    files, errors = discover(paths, settings, force_exclude=force_exclude)
    problem = vendor_target_problem(vendor_path) if runtime == "vendor" and in_place and not check_only else None
    if problem:  # before any script is rewritten to import a runtime that would not be there
        click.echo(f"graphify: error: {problem}", err=True)
        sys.exit(2)
    checker, vendor_failed = None, False
    if verify:
        from graphify.verify import verify_file

        def checker(path):
            report = verify_file(path, steps, [], None, None, settings=settings)
            return report.passed, report.message

    try:
        run = rewrite_files(
            files, settings, in_place=in_place, check_only=check_only, verify=checker, runtime=choice, named=named_files(paths)
        )
        if runtime == "vendor" and (run.changed or os.path.exists(vendor_path)) and not check_only:
            try:
                run.notes.append(vendor_runtime(vendor_path, write=in_place))
            except OSError as exc:
                run.notes.append(f"graphify: error: {exc}")
                vendor_failed = True
    except Exception as exc:  # a bug of ours: one line, not a traceback
        if os.environ.get("GRAPHIFY_DEBUG"):
            raise
        click.echo(f"graphify: internal error: {type(exc).__name__}: {exc}", err=True)
        sys.exit(2)
    for diff in run.diffs:
        click.echo(diff, nl=False)
    _tell(run, [f"{e.path}: {e.message}" for e in errors])
    sys.exit(2 if errors or vendor_failed else run.exit_code)


def _settings(paths, select, ignore, defer_host_reads):
    """The settings of the files (the nearest [tool.graphify]) with the command line's on top; exit 2 on a bad one."""
    from graphify.config import ConfigError, load_settings, split_selectors

    try:
        settings = load_settings(paths).with_cli(split_selectors(select), split_selectors(ignore))
    except ConfigError as exc:
        click.echo(f"graphify: error: {exc}", err=True)
        sys.exit(2)
    if defer_host_reads is not None:
        settings.defer_host_reads = defer_host_reads
    return settings


def _runtime_choice(runtime: str, vendor_path: str):
    from graphify.rewrite.bundle import RuntimeChoice

    vendor_module = os.path.splitext(os.path.basename(vendor_path))[0]
    if runtime == "vendor" and not (vendor_path.endswith(".py") and vendor_module.isidentifier()):
        raise click.UsageError(f"--vendor-path must name a Python module file (NAME.py), not {vendor_path!r}")
    return RuntimeChoice(runtime, vendor_module if runtime == "vendor" else "graphify.runtime")


def _tell(run, errors: list[str] = ()) -> None:
    """The per-loop notes, then the errors, on standard error."""
    for note in run.notes:
        click.echo(note, err=True)
    for e in [*errors, *run.errors]:
        click.echo(f"graphify: {e}", err=True)


def _rewrite_stdin(name: str, settings, check_only: bool, runtime) -> int:
    """As `ruff format -`: the rewritten source (or the input, unchanged) on standard output, notes on
    standard error."""
    from graphify.commands.rewrite_files import rewrite_text
    from graphify.files import SourceError
    from graphify.notebooks import read_stdin

    try:
        text = read_stdin(name)
    except SourceError as exc:
        click.echo(f"graphify: {name}: {exc.message}", err=True)
        return 2
    run, output = rewrite_text(name, text, settings, check_only, runtime)
    if not check_only:
        click.echo(output, nl=False)
    _tell(run)
    return run.exit_code


def register(group: click.Group) -> None:
    group.add_command(rewrite_command)
