"""`rewrite --runtime import|inline|vendor`: how a rewritten file gets CapturedStep. The default adds one
import; `inline` pastes the runtime (with its version) into the file; `vendor` imports one copy written
for the project. Rewritten files are recognised by the statements that bind the runtime, whichever
way it came, and the inline and vendored rewrites run where graphify is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest
from click.testing import CliRunner
from fixture_cases import CHECK

import graphify.cli as cli
from graphify.config import Settings
from graphify.rewrite import rewrite_source
from graphify.rewrite.bundle import RUNTIME_DIR, RuntimeChoice, runtime_version, vendor_code

SCRIPT = CHECK / "mnist_main_function.py"


def run(*args):
    return CliRunner().invoke(cli.cli, list(args))


def rewrite(source: str, mode: str, module: str = "graphify.runtime"):
    return rewrite_source(source, "train.py", Settings(), RuntimeChoice(mode, module))


def test_vendored_module_has_the_public_runtime():
    code = vendor_code()
    names: dict = {}
    exec(compile(code, "graphify_runtime.py", "exec"), names)
    assert {"CapturedStep", "GraphedModule", "GraphifyFallbackWarning", "build_on_capture_stream", "copy_outputs"} <= set(names)
    assert code.startswith(f'"""graphify runtime {runtime_version()}, written by')
    assert "graphify." not in code.replace("graphify.runtime as one module", "")  # imports nothing of graphify
    cst.parse_module(code)


def test_the_bundle_defines_every_name_the_runtime_modules_import_from_each_other():
    """A runtime module left out of the bundle shows only when its names are first called, in a user's run
    on the GPU; here every `from graphify.runtime.x import ...` is checked against the vendored module."""
    names: dict = {}
    exec(compile(vendor_code(), "graphify_runtime.py", "exec"), names)
    imported = set()
    for path in RUNTIME_DIR.glob("*.py"):
        for stmt in cst.parse_module(path.read_text()).body:
            for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
                if isinstance(small, cst.ImportFrom) and cst.Module([]).code_for_node(small.module).startswith("graphify.runtime"):
                    imported |= {alias.name.value for alias in small.names}
    assert imported and imported <= set(names), imported - set(names)


def test_inline_pastes_the_runtime_once_and_changes_nothing_else():
    source = SCRIPT.read_text()
    imported, inline = rewrite(source, "import").code, rewrite(source, "inline").code
    version = runtime_version()
    begin = inline.index(f"# --- graphify runtime {version}: pasted by")
    end = inline.index(f"# --- end of graphify runtime {version} ---\n") + len(f"# --- end of graphify runtime {version} ---\n")
    assert inline[begin - 2 : begin] == "\n\n"  # one blank line sets the paste apart
    assert imported.replace("from graphify.runtime import CapturedStep\n", "") == inline[: begin - 1] + inline[end:]
    assert "from graphify" not in inline
    again = rewrite(inline, "inline")
    assert again.code == inline and not any(o.rewritten for o in again.outcomes)
    # the file after the rewrite passes `rewrite --check`: its loops are recognised as captured
    assert not any(o.rewritten for o in rewrite(inline, "import").outcomes)


def test_vendor_imports_from_the_named_module():
    code = rewrite(SCRIPT.read_text(), "vendor", "project_runtime").code
    assert "from project_runtime import CapturedStep\n" in code and "graphify.runtime" not in code
    assert not any(o.rewritten for o in rewrite(code, "vendor", "project_runtime").outcomes)


def test_vendor_cli_writes_once_and_updates_a_stale_copy(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT.read_text())
    dry = run("rewrite", "--runtime", "vendor", "train.py")
    assert "graphify_runtime.py: would write the vendored runtime" in dry.stderr
    assert not (tmp_path / "graphify_runtime.py").exists()
    wet = run("rewrite", "--runtime", "vendor", "--in-place", "train.py")
    assert wet.exit_code == 1 and "graphify_runtime.py: wrote the vendored runtime" in wet.stderr
    assert (tmp_path / "graphify_runtime.py").read_text() == vendor_code()
    assert run("rewrite", "--runtime", "vendor", "--check", "train.py").exit_code == 0
    (tmp_path / "graphify_runtime.py").write_text('"""graphify runtime 1 ..."""\n')
    again = run("rewrite", "--runtime", "vendor", "--in-place", "train.py")
    assert "graphify_runtime.py: wrote the vendored runtime" in again.stderr
    assert (tmp_path / "graphify_runtime.py").read_text() == vendor_code()


@pytest.mark.parametrize("path", ["runtime.txt", "my-runtime.py", "pkg/"])
def test_vendor_path_must_be_a_module_file(tmp_path, monkeypatch, path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT.read_text())
    result = run("rewrite", "--runtime", "vendor", "--vendor-path", path, "train.py")
    assert result.exit_code == 2 and "--vendor-path must name a Python module file" in result.output


def test_vendor_never_overwrites_a_file_of_the_users_and_rewrites_no_script_it_cannot_serve(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SCRIPT.read_text())
    (tmp_path / "helpers.py").write_text("def mine():\n    return 1\n")
    taken = run("rewrite", "--runtime", "vendor", "--vendor-path", "helpers.py", "--in-place", "train.py")
    assert taken.exit_code == 2 and "a file of yours is there" in taken.stderr
    assert (tmp_path / "helpers.py").read_text() == "def mine():\n    return 1\n"
    assert (tmp_path / "train.py").read_text() == SCRIPT.read_text()
    nowhere = run("rewrite", "--runtime", "vendor", "--vendor-path", "missing/rt.py", "--in-place", "train.py")
    assert nowhere.exit_code == 2 and "cannot write the vendored runtime there" in nowhere.stderr
    assert (tmp_path / "train.py").read_text() == SCRIPT.read_text()


@pytest.mark.parametrize("mode", ["inline", "vendor"])
def test_check_leaves_graphifys_own_runtime_alone(tmp_path, monkeypatch, mode):
    """The pasted or vendored runtime is not the user's code: `check` (and its pre-commit hook) reports the
    rewritten script as it reports one that imports the runtime."""
    monkeypatch.chdir(tmp_path)
    for name in ("train.py", "imported.py"):
        (tmp_path / name).write_text(SCRIPT.read_text())
    assert run("rewrite", "--runtime", mode, "--in-place", "train.py").exit_code == 1
    assert run("rewrite", "--in-place", "imported.py").exit_code == 1
    checked = run("check", "--format", "json", *(["graphify_runtime.py"] if mode == "vendor" else []), "train.py")
    expected = run("check", "--format", "json", "imported.py")
    assert checked.stdout.replace("train.py", "imported.py").count('"code"') == expected.stdout.count('"code"')
    assert "graphify_runtime.py" not in checked.stdout


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["inline", "vendor"])
def test_rewrite_runs_without_graphify_installed(tmp_path, mode):
    """graphify made unimportable: the rewritten script still runs, and prints what the original does (CPU)."""
    (tmp_path / "train.py").write_text(SCRIPT.read_text())
    (tmp_path / "rewritten").mkdir()
    target = tmp_path / "rewritten" / "train.py"
    target.write_text(SCRIPT.read_text())
    result = subprocess.run(
        [sys.executable, "-m", "graphify", "rewrite", "--in-place", "--runtime", mode, "train.py"],
        cwd=target.parent,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1, result.stderr
    blocked = "import sys; sys.modules['graphify'] = None; sys.argv = ['train.py', '--epochs', '1']; exec(open('train.py').read())"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    outputs = [
        subprocess.run([sys.executable, "-c", blocked], cwd=folder, capture_output=True, text=True, env=env, timeout=300)
        for folder in (tmp_path, target.parent)
    ]
    assert outputs[1].returncode == 0, outputs[1].stderr[-2000:]
    assert outputs[0].stdout == outputs[1].stdout
    assert Path(target.parent / "graphify_runtime.py").exists() == (mode == "vendor")


@pytest.mark.cuda
def test_inline_and_vendored_rewrites_capture_on_the_gpu(tmp_path):
    """On CUDA the pasted and vendored runtimes capture (no fallback warning), graphify unimportable, and
    print exactly what the default rewrite prints: the same graphs replayed."""
    outputs = {}
    for mode in ("import", "inline", "vendor"):
        folder = tmp_path / mode
        folder.mkdir()
        (folder / "train.py").write_text(SCRIPT.read_text())
        cmd = [sys.executable, "-m", "graphify", "rewrite", "--in-place", "--runtime", mode, "train.py"]
        assert subprocess.run(cmd, cwd=folder, capture_output=True, text=True).returncode == 1
        block = "sys.modules['graphify'] = None; " if mode != "import" else ""
        # cuDNN's default convolution algorithms may differ in the last digits from one process to the next
        exact = "import torch; torch.backends.cudnn.deterministic = True; "
        probe = f"import sys; {exact}{block}sys.argv = ['train.py', '--epochs', '2']; exec(open('train.py').read())"
        done = subprocess.run([sys.executable, "-c", probe], cwd=folder, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert "GraphifyFallbackWarning" not in done.stderr, done.stderr[-2000:]
        outputs[mode] = done.stdout
    assert outputs["inline"] == outputs["import"] == outputs["vendor"]


LOOP = """
model = nn.Linear(4, 2).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in [(torch.randn(8, 4), torch.randn(8, 2)) for _ in range(4)]:
    x, y = x.cuda(), y.cuda()
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
"""


@pytest.mark.parametrize(
    "head, expected",
    [
        (  # after the docstring, the __future__ import and the leading imports, a blank line before the code
            '"""Train."""\nfrom __future__ import annotations\n\nimport torch\nfrom torch import nn\nsys_path = []\n',
            '"""Train."""\nfrom __future__ import annotations\n\nimport torch\nfrom torch import nn\nfrom graphify.runtime import CapturedStep\n\nsys_path = []\n',
        ),
        (  # added to an import of the same module, not a second one
            "from graphify.runtime import GraphedModule\nimport torch\nfrom torch import nn\n",
            "from graphify.runtime import CapturedStep, GraphedModule\nimport torch\nfrom torch import nn\n",
        ),
        (  # under another name where the file binds `CapturedStep` itself
            "import torch\nfrom torch import nn\n\nclass CapturedStep:\n    pass\n",
            "import torch\nfrom torch import nn\nfrom graphify.runtime import CapturedStep as CapturedStep_2\n\nclass CapturedStep:\n    pass\n",
        ),
    ],
    ids=["after-leading-imports", "merged", "aliased"],
)
def test_the_runtime_import_joins_the_leading_imports(head, expected):
    code = rewrite(head + LOOP, "import").code
    assert code.startswith(expected), code
    assert code.count("from graphify.runtime import") == 1
