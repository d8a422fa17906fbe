"""The metamorphic suite (tests/metamorphic): transformations that keep a script's meaning must not change what
graphify decides on it. Every pair where it does is listed in tests/metamorphic/known_differences.txt, so that a new
difference fails here, and so does a fixed one until its line is removed. scripts/metamorphic-report prints the rates."""

import textwrap
from collections import Counter

import pytest
from metamorphic import TRANSFORMATIONS
from metamorphic.suite import KNOWN_DIFFERENCES, known_differences, parses, run, script_name, scripts, transformed, unmarked


def _by_name(name):
    return next(t for t in TRANSFORMATIONS if t.name == name).apply


def _applied(name, source):
    return _by_name(name)(textwrap.dedent(source))


def test_each_transformation_applies_to_several_scripts_and_keeps_them_parsing():
    sources = {script_name(p): unmarked(p.read_text()) for p in scripts()}
    applies, broken = Counter(), []
    for t in TRANSFORMATIONS:
        assert t.summary and "\n" not in t.summary, f"{t.name} needs a one-line docstring"
        for name, source in sources.items():
            out = transformed(t, source)
            if out is not None:
                applies[t.name] += 1
                if not parses(out):
                    broken.append(f"{t.name} {name}")
    assert len(TRANSFORMATIONS) >= 20
    assert broken == [], "transformed scripts that do not parse"
    assert sorted(t.name for t in TRANSFORMATIONS if applies[t.name] < 5) == [], "transformations that apply to fewer than 5 scripts"


@pytest.mark.slow  # about 2000 analyses: a minute of CPU, spread over the cores
def test_graphify_decides_the_same_or_the_difference_is_known():
    found = {(p.transformation, p.script): p.difference for p in run() if p.parses and p.difference is not None}
    known = known_differences()
    new = sorted(set(found) - set(known))
    fixed = sorted(set(known) - set(found))
    message = []
    if new:
        message.append(f"new differences: add to {KNOWN_DIFFERENCES.name} (or fix the analysis):")
        message += [f"{t} {s}  {found[(t, s)]}" for t, s in new]
    if fixed:
        message.append(f"fixed differences: remove from {KNOWN_DIFFERENCES.name}:")
        message += [f"{t} {s}" for t, s in fixed]
    assert not message, "\n".join(message)


def test_rename_is_scope_safe():
    source = """\
    import torch.nn as nn

    class Trainer:
        model = None

    def train(model, steps):
        model.train()
        print("model", steps)
        return dict(net=model)

    model = nn.Linear(2, 2)
    train(model, steps=3)
    model.weight.model = 1
    """
    assert _applied("rename_model", source) is None  # `model` is also a class attribute
    del_class = source.replace("class Trainer:\n        model = None\n\n    ", "")
    assert _applied("rename_model", del_class) == textwrap.dedent("""\
    import torch.nn as nn

    def train(net_, steps):
        net_.train()
        print("model", steps)
        return dict(net=net_)

    net_ = nn.Linear(2, 2)
    train(net_, steps=3)
    net_.weight.model = 1
    """)
    assert _applied("rename_model", del_class.replace("steps=3", "steps=3, model=model")) is None  # passed as a keyword
    assert _applied("rename_model", del_class + "net_ = 0\n") is None  # the new name is taken


def test_for_to_while_next():
    source = """\
    for i, (x, y) in enumerate(loader):
        loss = model(x).sum()
        loss.backward()
    """
    assert _applied("for_to_while_next", source) == textwrap.dedent("""\
    iterator_ = iter(enumerate(loader))
    while True:
        try:
            i, (x, y) = next(iterator_)
        except StopIteration:
            break
        loss = model(x).sum()
        loss.backward()
    """)


def test_enumerate_to_counter_keeps_the_counter_local_to_the_loop():
    source = """\
    for step, batch in enumerate(loader, 1):
        loss = model(batch)
        loss.backward()
    """
    assert _applied("enumerate_to_counter", source) == textwrap.dedent("""\
    step = 1
    for batch in loader:
        loss = model(batch)
        loss.backward()
        step += 1
    """)
    assert _applied("enumerate_to_counter", source + "print(step)\n") is None
    assert _applied("enumerate_to_counter", source.replace("loss.backward()", "if loss > 1:\n            continue")) is None


def test_split_or_join_conditions():
    split = """\
    if a and (b or c):
        run()
    """
    nested = """\
    if a:
        if b or c:
            run()
    """
    assert _applied("split_or_join_conditions", split) == textwrap.dedent(nested)
    assert _applied("split_or_join_conditions", nested) == textwrap.dedent("""\
    if a and (b or c):
        run()
    """)
    assert _applied("split_or_join_conditions", textwrap.dedent(split) + "else:\n    stop()\n") is None


def test_dataclass_config():
    source = """\
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    """
    assert _applied("dataclass_config", source) == textwrap.dedent("""\
    import argparse
    from dataclasses import dataclass


    @dataclass
    class Config_:
        batch_size: int = 32
        lr: float = 0.001
        dry_run: bool = False


    args = Config_()
    """).replace("\n\nargs", "\n\n\nargs")
    assert _applied("dataclass_config", source.replace('action="store_true"', 'type=str, default="x"')) is None  # argparse would convert it


def test_move_model_train_out_of_and_into_the_function():
    inside = """\
    def train(model, loader):
        model.train()
        for x in loader:
            model(x).sum().backward()


    for epoch in range(2):
        train(net, loader)
    """
    outside = """\
    def train(model, loader):
        for x in loader:
            model(x).sum().backward()


    for epoch in range(2):
        net.train()
        train(net, loader)
    """
    assert _applied("move_model_train", inside) == textwrap.dedent(outside)
    assert _applied("move_model_train", outside) == textwrap.dedent(inside)


def test_from_torch_import_binds_what_it_uses():
    source = """\
    import torch
    import torch.nn as nn

    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """
    assert _applied("from_torch_import", source) == textwrap.dedent("""\
    import torch
    from torch import optim
    from torch import nn

    model = nn.Linear(2, 2)
    optimizer = optim.SGD(model.parameters(), lr=0.1)
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """)
    taken = source.replace("torch.nn.utils", "optim = torch.nn.utils")
    out = _applied("from_torch_import", taken)  # `optim` is a variable here: torch.optim stays
    assert "torch.optim.SGD" in out and "from torch import optim" not in out and "from torch import nn" in out
