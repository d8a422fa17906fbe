"""What a capture needs of the optimizers a step runs, and what the runtime gives back when it leaves a
step eager for good.

A captured optimizer step must keep its step count on the device (`capturable=True`), read its learning
rate from a device tensor where it can, and freeze every other setting; the runtime follows the
settings it froze and captures again when one moves. Capturable arithmetic run eagerly launches more
kernels than the host-side kind, so a step that stays eager gets the optimizers' own settings back.
"""

from __future__ import annotations

import numbers

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
    to `frozen`; each optimizer's number of param groups, once, to `group_counts`. Returns the
    (group, float) swapped, for the groups to show floats again after the capture."""
    swapped = []
    for optimizer in optimizers:
        if not any(o is optimizer for o, _ in group_counts):  # once: any other count drops every graph
            group_counts.append((optimizer, len(optimizer.param_groups)))
        for group in optimizer.param_groups:
            if "capturable" in group and not torch.is_tensor(group["lr"]):
                lr = torch.tensor(group["lr"], dtype=torch.float32, device=group["params"][0].device)
                lr_tensors.append([group, lr, group["lr"]])
                swapped.append((group, group["lr"]))
                group["lr"] = lr
            elif not torch.is_tensor(group["lr"]):
                frozen.append((group, "lr", group["lr"]))
            # schedulers and callbacks may move any of these (OneCycleLR cycles betas and momentum; eps,
            # weight decay, dampening): the graph froze them
            frozen += [(group, k, v) for k, v in group.items() if k not in ("params", "lr") and _setting(v)]
    return swapped


def moved_settings(group_counts: list, frozen: list) -> str | None:
    """None while every setting the graph froze holds; "lr" when learning rates alone moved (the step may
    capture again at once); "other" when a param group was added or another setting moved: a momentum
    turned on, a new group, make optimizer state that the next step creates lazily, which must happen in
    an eager step, not in a capture."""
    for optimizer, groups in group_counts:  # plain loops: this runs before every replay
        if len(optimizer.param_groups) != groups:
            return "other"
    for group, name, value in frozen:
        if group[name] is not value and group[name] != value:
            return "lr" if all(k == "lr" or g[k] is v or g[k] == v for g, k, v in frozen) else "other"
    return None


def _setting(value) -> bool:
    """A number, flag or name (or a tuple of numbers, as betas): what a graph freezes and `==` compares."""
    if isinstance(value, tuple):
        return all(isinstance(v, numbers.Number) for v in value)
    return value is None or isinstance(value, (numbers.Number, str))
