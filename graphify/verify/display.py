"""What `graphify verify` shows: a live progress display while running, then the result tables."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.progress import Progress as RichProgress
from rich.table import Table

from graphify.verify import timing
from graphify.verify.report import VerifyReport


class Progress:
    """Live display on stderr: the current stage, then one bar per version."""

    def __init__(self, console: Console) -> None:
        self.bars = RichProgress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("steps"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.tasks: dict[str, int] = {}
        self.status = None

    def __enter__(self) -> "Progress":
        self.bars.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bars.stop()

    def stage(self, text: str) -> None:
        if self.status is not None:
            self.bars.remove_task(self.status)
        self.status = self.bars.add_task(text, total=None) if not text.startswith("running") else None

    def step(self, label: str, done: int, total: int) -> None:
        if label not in self.tasks:
            self.tasks[label] = self.bars.add_task(label, total=total)
        self.bars.update(self.tasks[label], completed=min(done, total))


def render(report: VerifyReport, console: Console, errors: Console | None = None) -> None:
    """The report on `console`; when it could not be verified (exit 2), the error and the failed run's
    stderr tail on `errors` (stderr), if given. Messages are never wrapped: they may be grepped or copied."""
    loop = report.loop
    if loop:
        where = f"{loop['kind']} loop at line {loop['line']}" + (f" in {loop['function']}" if loop["function"] else "")
        device = report.original.data.get("device") if report.original is not None and report.original.ok else None
        console.print(f"[bold]{report.path}[/]: {where}, captured as {loop['step_function']}" + (f"; ran on {device}" if device else ""))
    if report.original is not None and report.original.ok and report.rewrite is not None:
        console.print(_runs_table(report))
        if report.rewrite.ok and report.original.data.get("time_split"):
            console.print(_time_table(report))
    if report.comparison is not None:
        console.print(_equivalence_table(report))
        if not report.loop["records_values"]:
            console.print("note: the probe found no scalar loss (or output) to record; only the state after each step is compared")
    if report.verdict:
        speedup = report.speedup
        console.print(f"speedup: {speedup:.2f}x" if speedup else "speedup: not measured")
        console.print(f"verdict: {escape(report.verdict)}", soft_wrap=True)
    if report.time_verdict:
        console.print(f"where the time goes: {escape(report.time_verdict)}", soft_wrap=True)
    for warning in report.warnings:
        console.print(f"[yellow]warning[/]: {escape(warning)}", highlight=False, soft_wrap=True)
    style = {0: "bold green", 1: "bold red"}.get(report.exit_code, "bold yellow")
    out = errors if errors is not None and report.status == "error" else console
    out.print(f"[{style}]{report.status.upper()}[/]: {escape(report.message)}", highlight=False, soft_wrap=True)
    if report.detail:
        out.print(report.detail, markup=False, highlight=False, soft_wrap=True)
    if report.workdir:
        console.print(f"files kept in {report.workdir}")


def _runs_table(report: VerifyReport) -> Table:
    runs = [r for r in (report.original, report.rewrite) if r is not None and r.data]
    table = Table("", *[r.label for r in runs], title="runs", title_justify="left")
    table.columns[0].no_wrap = True
    profiles = [r.data.get("profile") or {} for r in runs]
    timed = report.on_cuda  # on the CPU both run the same eager code: times would only be noise
    rows = [
        ("steps", [str(r.steps) for r in runs]),
        ("ms / step", [_fmt(r.step_ms, "{:.2f}") if timed else "not measured (no CUDA)" for r in runs]),
        ("setup s", [_fmt(r.setup_s, "{:.3f}") if timed else "not measured (no CUDA)" for r in runs]),
        ("peak memory", [_bytes(r.data.get("peak_memory")) for r in runs]),
        ("kernels / step", [_fmt(p.get("kernels_per_step"), "{:.0f}") for p in profiles]),
        ("launches / step", [_fmt(p.get("launches_per_step"), "{:.0f}") for p in profiles]),
        ("launch share", [_fmt(p.get("launch_share"), "{:.0%}") for p in profiles]),
        ("GPU busy", [_fmt(p.get("gpu_busy_share"), "{:.0%}") for p in profiles]),
        ("graphs captured", [_fmt(r.data.get("graphs"), "{}") for r in runs]),
    ]
    for name, cells in rows:
        table.add_row(name, *cells)
    return table


def _time_table(report: VerifyReport) -> Table:
    """Each part of each run: seconds, and its share of the run after start-up (start-up: of the whole run)."""
    runs = [r for r in (report.original, report.rewrite) if r.data.get("time_split")]
    splits = [r.data["time_split"] for r in runs]
    title = "where the time goes (% of the run after start-up)"
    table = Table("", *[r.label for r in runs], title=title, title_justify="left")
    table.columns[0].no_wrap = True
    for cell in table.columns[1:]:
        cell.justify = "right"
    shares = [timing.shares(s) or {} for s in splits]
    for part in timing.PARTS:
        cells = []
        for split, share in zip(splits, shares):
            seconds = split["seconds"][part]
            of = seconds / split["whole_s"] if part == timing.STARTUP and split["whole_s"] > 0 else share.get(part)
            cells.append(f"{_seconds(seconds)} {_fmt(of, '{:>4.0%}')}")
        table.add_row(timing.LABELS[part] + (" (% of the whole run)" if part == timing.STARTUP else ""), *cells)
        if part == timing.STEP:
            table.add_row("  host reads in the step", *[f"{_seconds(s['host_reads_in_step_s'])}     " for s in splits])
    table.add_row("whole run", *[f"{_seconds(s['whole_s'])}     " for s in splits])
    table.add_row("steps in it", *[f"{s['steps']}     " for s in splits])
    return table


def _seconds(s: float) -> str:
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.1f} ms" if s >= 1e-3 else f"{s * 1e3:.2f} ms"


def _equivalence_table(report: VerifyReport) -> Table:
    c = report.comparison
    tol = "exact" if c.exact else f"losses rtol {c.rtol:g}, atol {c.atol:g}; state {c.update_tol:g} of each step's update"
    title = f"equivalence, each step from the original's state ({tol})"
    table = Table("", "compared", "max abs diff", "max rel diff", "first mismatch", "", title=title, title_justify="left")
    table.columns[0].no_wrap = True
    rows = [
        ("steps", None),
        ("losses" if report.loop["kind"] == "train" else "outputs", c.losses),
        ("parameters (/ update)", c.params),
        ("optimizer state, buffers", c.state),
    ]
    for name, d in rows:
        if d is None:
            ok = c.steps[0] == c.steps[1]
            table.add_row(name, f"{c.steps[0]} / {c.steps[1]}", "", "", "", _mark(ok))
            continue
        mismatch = d.first_bad or (d.problems[0] if d.problems else "")
        table.add_row(name, str(d.compared), _fmt(d.max_abs, "{:.3g}"), _fmt(d.max_rel, "{:.3g}"), mismatch, _mark(d.ok))
    return table


def _mark(ok: bool) -> str:
    return "[green]ok[/]" if ok else "[red]DIFFERS[/]"


def _fmt(value, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _bytes(n) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"
