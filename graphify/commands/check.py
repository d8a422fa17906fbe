"""`graphify check PATHS` (or `-`, standard input); `register(cli)` adds it to a click group.

Exit codes: 0 nothing found, 1 breakers found (0 with --exit-zero), 2 usage or config error, or a
file that could not be analysed (the other files are still analysed and reported).

Start-up matters (pre-commit runs this on a handful of files): the analysis (libcst) and pathspec are
imported only by the code paths that need them.
"""

from __future__ import annotations

import gc
import math
import os
import sys
from typing import TYPE_CHECKING, Callable, Sequence

import click

from graphify.reporters import FORMATS, TEXT_FORMATS

if TYPE_CHECKING:  # pragma: no cover
    from graphify.config import Settings
    from graphify.model import FileError, Report

# Files up to this many are analysed in this process: a pool's start-up would dominate.
PARALLEL_THRESHOLD = 8

# analyze_source(source, path, settings) -> Report
Analyzer = Callable[[str, str, "Settings"], "Report"]


def get_analyzer() -> Analyzer:
    # The import (libcst most of all) builds thousands of classes and functions that live as long as
    # the process: frozen out of the cyclic collector, whose passes over them (here, in the pool's
    # forked workers, and at exit) find nothing and cost about 8% of a one-file check.
    enabled = gc.isenabled()
    gc.disable()
    try:
        from graphify.engine import analyze_source
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
    return analyze_source


@click.command("check", short_help="Report graph breakers and a verdict for each loop (`-`: standard input).")
@click.argument("paths", nargs=-1, type=click.Path(readable=False))  # an unreadable file is one error line, not a usage error
@click.option(
    "--output-format",
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="concise",
    show_default=True,
    help="concise: one line per breaker (`text` is the same); full: with its code frame and fix hint; json, sarif, github.",
)
@click.option(
    "--select", metavar="CODES", help="Rules to check: codes, prefixes (GFY0), categories or ALL, comma-separated. Overrides the config."
)
@click.option("--extend-select", metavar="CODES", help="Rules to check in addition to the config's select list.")
@click.option("--ignore", metavar="CODES", help="Rules to skip, comma-separated; added to the config's ignore list.")
@click.option("--config", "config_file", metavar="PATH", help="Read [tool.graphify] from this pyproject.toml instead of the nearest one.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when breakers are found (file errors still exit 2).")
@click.option("--statistics", is_flag=True, help="Print how many breakers of each rule instead of the breakers (text or json).")
@click.option("-o", "--output-file", metavar="PATH", help="Write the report to PATH instead of standard output.")
@click.option("-q", "--quiet", is_flag=True, help="Print nothing but errors; the exit code still tells.")
@click.option(
    "--color/--no-color", default=None, help="Colour the text report (default: when writing to a terminal, unless NO_COLOR is set)."
)
@click.option("--stdin-filename", metavar="PATH", help="The path to report for source read from standard input (`-`).")
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None, help="Worker processes (default: CPU count).")
@click.option("--force-exclude", is_flag=True, help="Apply exclude / extend-exclude to files named on the command line too.")
def check(
    paths: tuple[str, ...],
    fmt: str,
    select: str | None,
    extend_select: str | None,
    ignore: str | None,
    config_file: str | None,
    exit_zero: bool,
    statistics: bool,
    output_file: str | None,
    quiet: bool,
    color: bool | None,
    stdin_filename: str | None,
    jobs: int | None,
    force_exclude: bool,
) -> None:
    """Report CUDA-graph breakers in the training and inference loops of PATHS (default: .; `-`: standard input)."""
    from graphify.config import ConfigError, load_settings, load_settings_from, split_selectors

    paths = paths or (".",)
    if output_file and os.path.isfile(output_file) and output_file.endswith((".py", ".pyi", ".ipynb")):
        raise click.UsageError(f"-o {output_file}: that is a source file; the report would overwrite it")
    if statistics and fmt not in (*TEXT_FORMATS, "json"):
        raise click.UsageError(f"--statistics prints text or json, not {fmt}")
    try:
        settings = load_settings_from(config_file) if config_file else load_settings([stdin_filename or "."] if paths == ("-",) else paths)
        settings = settings.with_cli(split_selectors(select), split_selectors(ignore), split_selectors(extend_select))
    except ConfigError as exc:
        fail(str(exc))
    output = Output(output_file, quiet, color)
    try:
        code = _check(paths, settings, fmt, exit_zero, statistics, jobs or os.cpu_count() or 1, force_exclude, output, stdin_filename)
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # a bug of ours: one line, not a traceback (GRAPHIFY_DEBUG=1 shows it)
        if os.environ.get("GRAPHIFY_DEBUG"):
            raise
        fail(f"internal error: {type(exc).__name__}: {exc}")
    sys.exit(code)


class Output:
    """Where the report goes: standard output, a file (-o), or nowhere (-q); and whether it is coloured."""

    def __init__(self, path: str | None, quiet: bool, color: bool | None) -> None:
        self.path, self.quiet, self.color = path, quiet, color

    def colored(self, fmt: str, statistics: bool) -> bool:
        if fmt not in TEXT_FORMATS or statistics or self.path:
            return False
        return self.color if self.color is not None else _want_color(sys.stdout)

    def write(self, text: str) -> None:
        if self.quiet:
            return
        if self.path is None:
            _write(sys.stdout, text)
            return
        try:
            with open(self.path, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as exc:
            fail(f"cannot write {self.path}: {exc.strerror or exc}")


def _check(paths, settings, fmt, exit_zero, statistics, jobs, force_exclude, output, stdin_filename=None) -> int:
    from graphify.files import discover, named_files
    from graphify.model import Report
    from graphify.reporters import render

    stdin = "-" in paths
    files, errors = discover([p for p in paths if p != "-"], settings, force_exclude=force_exclude) if len(paths) > stdin else ([], [])
    report = Report(errors=list(errors))
    if files or stdin:
        try:
            analyzer = get_analyzer()
        except ImportError as exc:
            fail(f"internal error: the analysis engine cannot be imported ({exc})")
        if files:
            report.extend(analyze_files(files, settings, analyzer, jobs))
        if stdin:
            report.extend(_analyze_stdin(stdin_filename or "-", settings, analyzer))
    warnings = _set_apart_warnings(report)
    if files:
        report.errors.extend(_syntax_errors(named_files(paths), report))
    report.errors.sort(key=lambda e: e.path)

    output.write(render(report, fmt, color=output.colored(fmt, statistics), statistics=statistics))
    for w in warnings if not output.quiet else ():
        _write(sys.stderr, f"graphify: warning: {report.where(w.path, w.line)}: {w.message}\n")
    for e in report.errors:
        _write(sys.stderr, error_line(e.path, e.message) + "\n")
    if report.errors:
        return 2
    return 1 if report.diagnostics and not exit_zero else 0


def _set_apart_warnings(report: Report) -> list[FileError]:
    """Take the warnings (unknown codes in suppression comments) out of the report's errors, in order."""
    from graphify.suppressions import UnknownCode

    warnings = [e for e in report.errors if isinstance(e, UnknownCode)]
    report.errors = [e for e in report.errors if not isinstance(e, UnknownCode)]
    return sorted(warnings, key=lambda w: (w.path, w.line))


def _analyze_stdin(name: str, settings, analyzer) -> Report:
    from graphify.files import SourceError
    from graphify.model import FileError, Report
    from graphify.notebooks import read_stdin

    try:
        text = read_stdin(name)
    except SourceError as exc:
        return Report(errors=[FileError(name, exc.message)])
    return analyze_file(name, settings, analyzer, text=text)


def _syntax_errors(named: set[str], report: Report) -> list[FileError]:
    """Files named on the command line that the analysis skipped unparsed (no training marker in
    them), when Python would not run them."""
    from graphify.files import SourceError, python_syntax_error, read_source
    from graphify.model import FileError

    seen = {d.path for d in report.diagnostics} | {lp.path for lp in report.loops} | {e.path for e in report.errors}
    found = []
    for path in sorted(named - seen):
        try:
            message = python_syntax_error(read_source(path), path)
        except SourceError:
            continue  # reported when it was read
        if message:
            found.append(FileError(path, message))
    return found


def error_line(path: str, message: str) -> str:
    message = " ".join(message.split("\n"))
    if message.startswith(path + ":"):  # already "path:line: ..."
        return f"graphify: {message}"
    return f"graphify: {path}: {message}"


def analyze_files(files: Sequence[str], settings: Settings, analyzer: Analyzer, jobs: int) -> Report:
    """One Report for all files; a process pool when there are many, this process otherwise."""
    from graphify.model import Report

    if jobs <= 1 or len(files) <= PARALLEL_THRESHOLD:
        total = Report()
        for path in files:
            total.extend(analyze_file(path, settings, analyzer))
        return total
    return _analyze_in_pool(files, settings, analyzer, jobs)


def analyze_file(path: str, settings: Settings, analyzer: Analyzer, text: str | None = None) -> Report:
    """Read (unless its `text` is given) and analyse one file or notebook; whatever goes wrong comes
    back as a FileError."""
    from graphify.files import SourceError
    from graphify.model import FileError, Report
    from graphify.notebooks import load_module
    from graphify.suppressions import UnknownCode, unknown_codes

    try:
        source, cell_starts = load_module(path, text)
    except SourceError as exc:
        return Report(errors=[FileError(path, exc.message)])
    try:
        report = analyzer(source, path, settings)
    except Exception as exc:  # never let one file stop the run
        return Report(errors=[FileError(path, f"internal error: {type(exc).__name__}: {exc}")])
    if cell_starts is not None:
        report.cell_starts[path] = cell_starts
    for line, code in unknown_codes(source):  # as ruff warns of unknown codes in its suppression comments
        report.errors.append(UnknownCode(path, f"unknown rule code '{code}' in a suppression comment; it suppresses nothing", line))
    return report


_worker_state: tuple = ()


def _init_worker(settings, analyzer) -> None:
    global _worker_state
    _worker_state = (settings, analyzer)


def _analyze_chunk(chunk: list[str]):
    from graphify.model import Report

    settings, analyzer = _worker_state
    total = Report()
    for path in chunk:
        total.extend(analyze_file(path, settings, analyzer))
    return total


def _analyze_in_pool(files: Sequence[str], settings: Settings, analyzer: Analyzer, jobs: int) -> Report:
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from graphify.model import FileError, Report

    workers = min(jobs, math.ceil(len(files) / 4))
    # Several small chunks per worker keep them busy to the end; interleaving spreads one folder's
    # big files over the chunks.
    n_chunks = min(len(files), workers * 8)
    chunks = [list(files[i::n_chunks]) for i in range(n_chunks)]
    total = Report()
    try:
        pool = ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(settings, analyzer))
    except (OSError, NotImplementedError):  # no process support here (sandbox, no /dev/shm): one process
        return analyze_files(files, settings, analyzer, jobs=1)
    with pool:
        futures = {pool.submit(_analyze_chunk, chunk): chunk for chunk in chunks}
        for future in as_completed(futures):
            try:
                total.extend(future.result())
            except Exception as exc:  # a worker died (out of memory, crash in a native parser...)
                why = f"internal error: worker process failed ({type(exc).__name__}: {exc})"
                total.errors.extend(FileError(path, why) for path in futures[future])
    return total


def _want_color(stream) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _write(stream, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except UnicodeEncodeError:
        enc = getattr(stream, "encoding", None) or "ascii"
        stream.write(text.encode(enc, "backslashreplace").decode(enc))
        stream.flush()
    except BrokenPipeError:  # `graphify check . | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        raise SystemExit(2 if stream is sys.stderr else 1) from None


def fail(message: str, code: int = 2):
    click.echo(f"graphify: error: {message}", err=True)
    sys.exit(code)


def register(group: click.Group) -> None:
    group.add_command(check)
