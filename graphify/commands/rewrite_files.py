"""What `graphify rewrite` does with files: diffs, atomic in-place writes, `--check`, per-loop notes.

Exit codes: 0 nothing to rewrite, 1 a file would change (or changed, with --in-place; or, with
--check, an eligible loop is not captured yet; or --verify failed), 2 usage error or a file that
could not be read or rewritten.
"""

from __future__ import annotations

import difflib
import io
import os
import tempfile
import tokenize
from dataclasses import dataclass, field
from typing import Callable, Sequence

from graphify.files import SourceError, is_notebook, python_syntax_error, read_source
from graphify.model import Report
from graphify.notebooks import CellSpanError, read_notebook
from graphify.rewrite import RewriteResult, rewrite_source
from graphify.analysis.rewritten import VENDOR_MARK, is_vendored_runtime
from graphify.rewrite.bundle import RuntimeChoice, vendor_code


@dataclass
class RewriteRun:
    diffs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line per loop, for stderr
    errors: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # files --verify kept unchanged
    pending: int = 0  # loops that could be captured but are not yet

    @property
    def exit_code(self) -> int:
        return 2 if self.errors else 1 if (self.changed or self.pending or self.rejected) else 0


def loop_notes(result: RewriteResult, written: bool, cell_starts: list[int] | None = None) -> list[str]:
    located = Report(cell_starts={result.path: cell_starts} if cell_starts else {})
    notes = []
    for o in result.outcomes:
        where = f"{located.where(o.path, o.line)}: {o.kind} loop" + (f" in {o.function}()" if o.function else "")
        # nothing has run yet: a written file captures when it runs, and the runtime may still keep a step eager
        verb = "rewritten, will" if written else "would"
        if o.model_only:
            graphed = ", ".join(f"`{name}`" for name in o.graphed)
            whose = "the models'" if len(o.graphed) > 1 else "the model's"
            notes.append(
                f"{where}: {verb} graph {whose} forward and backward as {graphed}; the rest of the step stays eager ({', '.join(o.reasons)})"
            )
        elif o.rewritten:
            notes.append(f"{where}: {verb} capture as `{o.step_name}` (warmup, capture, replay)")
        else:
            reasons = f" ({', '.join(o.reasons)})" if o.reasons else ""
            alone = f"; the model is not graphed alone either: {o.partial_refusal}" if o.partial_refusal else ""
            notes.append(f"{where}: left unchanged, {o.verdict.value}{reasons}{alone}")
    return notes


def unified_diff(path: str, before: str, after: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{path}", f"b/{path}"))


def vendor_target_problem(path: str) -> str | None:
    """Why the vendored runtime cannot be written at `path`, checked before any script is rewritten to
    import it: a file there that is not a graphify runtime (never overwritten), or a place not writable."""
    try:
        with open(path, encoding="utf-8") as f:
            head = f.read(len(VENDOR_MARK) + 1)  # and a BOM
    except FileNotFoundError:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            return f"{path}: cannot write the vendored runtime there (no such folder, or not writable)"
        return None
    except (OSError, UnicodeDecodeError) as e:
        return f"{path}: could not read it: {getattr(e, 'strerror', None) or e}"
    if not is_vendored_runtime(head):
        return f"{path}: a file of yours is there, not a graphify runtime; name another --vendor-path"
    if not _writable(path):
        return f"{path}: the vendored runtime there is read-only"
    return None


def vendor_runtime(path: str, write: bool) -> str:
    """Write (or say it would write) the project's copy of the runtime; a copy that is current stays.
    OSError (its message one line) when it cannot be read or written, or a file of the user's is there."""
    code = vendor_code()
    try:
        with open(path, encoding="utf-8") as f:
            current = f.read()
    except FileNotFoundError:
        current = None
    except (OSError, UnicodeDecodeError) as e:
        raise OSError(f"{path}: could not read the vendored runtime: {getattr(e, 'strerror', None) or e}") from None
    if current == code:
        return f"{path}: the vendored runtime is current"
    if current is not None and not is_vendored_runtime(current):
        raise OSError(f"{path}: a file of yours is there, not a graphify runtime; name another --vendor-path")
    what = "wrote" if write else "would write"
    if not write:
        return f"{path}: {what} the vendored runtime (graphify.runtime as one module)"
    try:
        if current is None:
            with open(path, "x", encoding="utf-8") as f:
                f.write(code)
        else:
            write_atomically(path, code)
    except OSError as e:
        raise OSError(f"{path}: could not write the vendored runtime: {e.strerror or e}") from None
    return f"{path}: {what} the vendored runtime (graphify.runtime as one module)"


def _ended(cell: str) -> str:
    """A notebook cell's code with a final newline, for a diff (cells are stored without one)."""
    return cell if cell.endswith("\n") or not cell else cell + "\n"


def _writable(path: str) -> bool:
    return os.access(path, os.W_OK) and bool(os.stat(path).st_mode & 0o222)  # root may write anything: go by the mode too


def write_atomically(path: str, text: str) -> None:
    """Replace the file in one step, in its own encoding, with its permissions and owner; never
    half-written, and never a file the user may not write (a read-only file stays as it is). A symbolic
    link stays a link (its target is rewritten); a file with other hard links is written over in place,
    after the new text is safely on disk beside it, so that every link sees it."""
    path = os.path.realpath(path)
    if not _writable(path):
        raise PermissionError(13, "the file is read-only")
    with open(path, "rb") as f:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(f.read()).readline)
    data = text.encode("utf-8-sig" if encoding == "utf-8-sig" else encoding)
    folder = os.path.dirname(os.path.abspath(path))
    st = os.stat(path)
    fd, tmp = tempfile.mkstemp(prefix=".graphify-", suffix=".py", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, st.st_mode & 0o7777)
        if hasattr(os, "chown") and (os.stat(tmp).st_uid, os.stat(tmp).st_gid) != (st.st_uid, st.st_gid):
            try:
                os.chown(tmp, st.st_uid, st.st_gid)
            except PermissionError:  # we may not give the file away: keep it, unwritten, rather than change its owner
                raise PermissionError(1, "its owner could not be kept") from None
        if st.st_nlink > 1:
            with open(path, "wb") as f:
                f.write(data)
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def rewrite_files(
    files: Sequence[str],
    settings,
    in_place: bool = False,
    check_only: bool = False,
    verify: Callable[[str], tuple[bool, str]] | None = None,
    runtime: RuntimeChoice = RuntimeChoice(),
    named: set[str] = frozenset(),
) -> RewriteRun:
    """`named`: files given on the command line, whose syntax errors are reported even when no loop could
    be in them."""
    run = RewriteRun()
    for path in files:
        rewrite = _rewrite(path, settings, runtime, run, path in named)
        if rewrite is None:
            continue
        source, result, notebook, text, cells = rewrite
        starts = notebook.starts if notebook else None
        if check_only or not result.changed:
            run.notes.extend(loop_notes(result, False, starts))
            continue
        run.changed.append(path)
        if not in_place:
            if notebook:
                run.diffs.append("".join(unified_diff(f"{path}:cell {n}", _ended(old), _ended(new)) for n, (old, new) in cells.items()))
            else:
                run.diffs.append(unified_diff(path, source, result.code))
            run.notes.extend(loop_notes(result, False, starts))
            continue
        if verify is not None and notebook:
            run.rejected.append(path)
            run.notes.append(f"{path}: not written: --verify runs scripts (export the notebook with `jupyter nbconvert --to script`)")
            continue
        if verify is not None:
            passed, summary = verify(path)
            if not passed:
                run.rejected.append(path)
                run.notes.append(f"{path}: not written: verification failed ({summary})")
                continue
        try:
            write_atomically(path, text)
        except OSError as e:
            run.errors.append(f"{path}: could not write: {e.strerror or e}")
            continue
        run.notes.extend(loop_notes(result, True, starts))
    if not check_only:
        run.pending = 0
    return run


def rewrite_text(
    name: str, text: str, settings, check_only: bool = False, runtime: RuntimeChoice = RuntimeChoice()
) -> tuple[RewriteRun, str]:
    """Standard input, rewritten as a file named `name` would be: the run (notes, errors) and the text to
    write to standard output, the input itself when nothing changes (as `ruff format -` does)."""
    run = RewriteRun()
    rewrite = _rewrite(name, settings, runtime, run, True, text)
    if rewrite is None:
        return run, text
    _, result, notebook, rewritten, _ = rewrite
    run.notes.extend(loop_notes(result, False, notebook.starts if notebook else None))
    if check_only:
        return run, text
    run.pending = 0
    if result.changed:
        run.changed.append(name)
    return run, rewritten


def _rewrite(path: str, settings, runtime: RuntimeChoice, run: RewriteRun, named: bool, text: str | None = None):
    """(source, RewriteResult, Notebook or None, the file's new text, changed cells) for one file, its text
    read unless given; None when it could not be read or rewritten (the error is in `run`)."""
    try:
        notebook = read_notebook(path, text) if is_notebook(path) else None
        source = notebook.source if notebook else read_source(path) if text is None else text
    except SourceError as e:
        run.errors.append(f"{path}: {e.message}")
        return None
    try:
        result = rewrite_source(source, path, settings, runtime)
    except Exception as e:  # a bug must not cost the user a traceback or a file
        run.errors.append(f"{path}: internal error while rewriting: {type(e).__name__}: {e}")
        return None
    run.errors.extend(f"{err.path}: {err.message}" for err in result.errors)
    if named and not result.outcomes and not result.errors and (error := python_syntax_error(source, path)):
        run.errors.append(f"{path}: {error}")
    rewritten, cells = result.code, {}
    if result.changed and notebook:
        try:
            rewritten, cells = notebook.with_source(result.code)
        except CellSpanError as e:  # the loops stay as they are, and are not pending: they cannot be rewritten
            run.notes.append(f"{path}: left unchanged: {e}")
            return None
    run.pending += sum(o.rewritten for o in result.outcomes)
    return source, result, notebook, rewritten, cells
