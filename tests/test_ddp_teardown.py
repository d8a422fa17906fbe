"""Graphs holding NCCL collectives are reset before any process group is shut down, however the script reaches
`destroy_process_group` (a name imported before graphify's runtime, `dist.`, a reference kept anywhere), and at
exit when it never does: NCCL's communicator waits, when destroyed, for every graph holding its kernels to be
destroyed, so one graph left alive hangs the rank. A fake graph stands in on the CPU (gloo); scripts/ddp-check
runs the tutorial traps (fixtures/traps/ddp_tutorial_*.py) under torchrun on 2 GPUs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch.distributed as dist

from graphify.runtime import distributed

ROOT = Path(__file__).resolve().parents[1]


class FakeGraph:
    def __init__(self, log):
        self.log = log

    def reset(self):
        self.log.append(("reset", dist.is_initialized()))


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_a_reference_kept_before_the_runtime_came_still_frees_the_graphs_first(group):
    """The script holds destroy_process_group where no rebinding reaches it (here: in a dict); the process
    group's own shutdown, which destroy calls on every group, resets the graphs first."""
    kept = {"destroy": getattr(dist.destroy_process_group, "__wrapped__", dist.destroy_process_group)}
    log = []
    graph = FakeGraph(log)
    dropped = []
    distributed.holds_collectives(graph)
    distributed.free_before_teardown(lambda: dropped.append(dist.is_initialized()))
    kept["destroy"]()
    assert dropped == [True] and log == [("reset", True)]  # before the group went
    assert not dist.is_initialized()


def test_freeing_twice_resets_once(group):
    log = []
    graph = FakeGraph(log)
    distributed.holds_collectives(graph)
    distributed.free_graphs()
    distributed.free_graphs()
    assert log == [("reset", True)]


def test_a_graph_dropped_before_teardown_is_not_kept_alive_for_it(group):
    log = []
    distributed.holds_collectives(FakeGraph(log))  # the step dropped it (captured again): nothing holds it
    distributed.free_graphs()
    assert log == []


@pytest.mark.parametrize("ending", ["destroy_imported", "dist_destroy", "no_destroy"])
def test_every_ending_of_a_script_resets_the_graphs_before_the_group_goes(tmp_path, ending):
    """The three ways the tutorial traps end, as their own processes: the name imported at the top before
    graphify's runtime, `dist.destroy_process_group()`, and no destroy at all (the exit hook)."""
    end = {
        "destroy_imported": "destroy_process_group()",
        "dist_destroy": "dist.destroy_process_group()",
        "no_destroy": "pass",
    }[ending]
    script = tmp_path / "script.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from torch.distributed import destroy_process_group, init_process_group
            import torch.distributed as dist
            from graphify.runtime import distributed

            class Graph:
                def reset(self):
                    print("reset, group alive:", dist.is_initialized(), flush=True)

            def main():
                init_process_group("gloo", init_method="file://{tmp_path / "store"}", rank=0, world_size=1)
                graph = Graph()
                distributed.holds_collectives(graph)
                {end}
                print("main returns", flush=True)
                return graph

            kept = main()
            """
        )
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    if ending == "no_destroy":
        assert lines == ["main returns", "reset, group alive: True"]
    else:
        assert lines == ["reset, group alive: True", "main returns"]
