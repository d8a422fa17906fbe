"""What a capture needs of the optimizers a step runs, and what the runtime gives back when it leaves a
step eager for good.

A captured optimizer step must keep its step count on the device (`capturable=True`), read its learning
rate from a device tensor where it can, and freeze every other setting; the runtime follows the
settings it froze and captures again when one moves. Capturable arithmetic run eagerly launches more
kernels than the host-side kind, so a step that stays eager gets the optimizers' own settings back.
"""

from __future__ import annotations

import numbers
import operator

import torch


def make_capturable(optimizers, changed: list) -> None:
    """Groups with `capturable=False` capture with it on, their step counts moved to the parameters'
    device; each (optimizer, group) changed is appended to `changed`."""
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            if group.get("capturable") is False:
                group["capturable"] = True
                changed.append((optimizer, group))
                for p in group["params"]:
                    step = optimizer.state.get(p, {}).get("step")
                    if torch.is_tensor(step) and step.device != p.device:
                        optimizer.state[p]["step"] = step.to(p.device, torch.float32)


def give_back(changed: list, in_use) -> None:
    """The groups in `changed` run as their optimizer was built again: `capturable=False`, step counts
    on the host (as that optimizer keeps them unless fused). Optimizers another step still captures with
    (`in_use`) are left as they are."""
    for optimizer, group in changed:
        if any(optimizer is o for o in in_use):
            continue
        group["capturable"] = False
        for p in group["params"]:
            step = optimizer.state.get(p, {}).get("step")
            if torch.is_tensor(step) and step.device.type != "cpu" and not group.get("fused"):
                optimizer.state[p]["step"] = step.to("cpu", torch.float32)
    changed.clear()


def use_tensor_lrs(optimizers, lr_tensors: list, frozen: list, group_counts: list) -> list:
    """During capture, groups that can read the learning rate from a device tensor do (appended to
    `lr_tensors` as [group, tensor, float it holds]); every other setting the graph freezes is appended
    to `frozen`, one (group, names, getter of their values, values at capture) a group; each optimizer's
    number of param groups, once, to `group_counts`. Returns the (group, float) swapped, for the groups
    to show floats again after the capture."""
    swapped = []
    for optimizer in optimizers:
        if not any(o is optimizer for o, _ in group_counts):  # once: any other count drops every graph
            group_counts.append((optimizer, len(optimizer.param_groups)))
        for group in optimizer.param_groups:
            # schedulers and callbacks may move any of these (OneCycleLR cycles betas and momentum; eps,
            # weight decay, dampening): the graph froze them
            names = [k for k, v in group.items() if k not in ("params", "lr") and _setting(v)]
            if "capturable" in group and not torch.is_tensor(group["lr"]):
                lr = torch.tensor(group["lr"], dtype=torch.float32, device=group["params"][0].device)
                lr_tensors.append([group, lr, group["lr"]])
                swapped.append((group, group["lr"]))
                group["lr"] = lr
            elif not torch.is_tensor(group["lr"]):
                names.insert(0, "lr")
            if names:
                values = _values_getter(names)
                frozen.append((group, tuple(names), values, values(group)))
    return swapped


def moved_settings(group_counts: list, frozen: list) -> str | None:
    """None while every setting the graph froze holds; "lr" when learning rates alone moved (the step may
    capture again at once); "other" when a param group was added or another setting moved: a momentum
    turned on, a new group, make optimizer state that the next step creates lazily, which must happen in
    an eager step, not in a capture."""
    for optimizer, groups in group_counts:  # plain loops: this runs before every replay
        if len(optimizer.param_groups) != groups:
            return "other"
    for group, _, values, at_capture in frozen:
        if values(group) != at_capture:  # tuples compare item by item: `is`, then `==`
            moved = {name for g, names, _, held in frozen for name, value in zip(names, held) if g[name] is not value and g[name] != value}
            return "lr" if moved == {"lr"} else "other"
    return None


def _values_getter(names: list):
    """The values of the settings `names` of a param group, as one tuple, read in one call."""
    if len(names) > 1:
        return operator.itemgetter(*names)
    name = names[0]
    return lambda group: (group[name],)


def _setting(value) -> bool:
    """A number, flag or name (or a tuple of numbers, as betas): what a graph freezes and `==` compares."""
    if isinstance(value, tuple):
        return all(isinstance(v, numbers.Number) for v in value)
    return value is None or isinstance(value, (numbers.Number, str))
