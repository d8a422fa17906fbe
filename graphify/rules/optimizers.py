"""non-capturable-optimizer and lr-scheduler: optimizer state and learning rates that capture freezes."""

import re

import libcst as cst

from graphify.analysis.checker import code_of, is_true, kwarg
from graphify.analysis.calls import method_call
from graphify.analysis.vocabulary import ADAM_FAMILY, NEVER_CAPTURABLE, OPTIMIZER, SCHEDULER
from graphify.model import Applicability, Fix, FixKind, Partial
from graphify.rules.registry import rule

NOT_CAPTURABLE = rule(
    "GFY401",
    "optimizer-not-capturable",
    "non-capturable-optimizer",
    "error",
    "Adam, AdamW, RMSprop and other optimizers with a `capturable` flag, built without `capturable=True`",
    True,
    Fix(FixKind.IN_PLACE, Applicability.SAFE),
)
NEVER_CAPTURABLE_RULE = rule(
    "GFY402",
    "optimizer-without-capture-support",
    "non-capturable-optimizer",
    "error",
    "LBFGS, SparseAdam and optimizers with host-side logic cannot be captured",
    False,
    Fix(partial=Partial.NEVER),
)
SCHEDULER_STEP = rule(
    "GFY411",
    "lr-scheduler-step",
    "lr-scheduler",
    "error",
    "`scheduler.step()` changes a float learning rate that capture froze",
    True,
    Fix(FixKind.IN_PLACE, Applicability.SAFE),
)
LR_ASSIGNMENT = rule(
    "GFY412",
    "lr-assignment",
    "lr-scheduler",
    "error",
    "assigning `param_group['lr']` changes a float learning rate that capture froze",
    True,
    Fix(FixKind.IN_PLACE, Applicability.SAFE),
)

RULES = (NOT_CAPTURABLE, NEVER_CAPTURABLE_RULE, SCHEDULER_STEP, LR_ASSIGNMENT)

# torch's `scheduler.step()`, and timm's per-update `scheduler.step_update(num_updates)`
_SCHEDULER_STEPS = ("step", "step_update")
# helpers named for setting an optimizer's learning rate: `adjust_learning_rate(optimizer, it)`, `opt.step_and_update_lr()`
_LR_SETTER = re.compile(r"(?:^|_)(?:adjust|update|set)_(?:learning_rate|lr)$")


def check(ck):
    seen = set()
    for name, call, module in (found for expr, site in ck.stepped_optimizers for found in ck.optimizer_classes(expr, site.env)):
        if (name, id(call)) in seen:
            continue
        seen.add((name, id(call)))
        fused = is_true(kwarg(call, "fused"))
        capturable = kwarg(call, "capturable")  # any expression but a literal False: the user decides
        if name in ADAM_FAMILY and (capturable is None or _is_false(capturable)):
            yield ck.finding_at(
                NOT_CAPTURABLE,
                call,
                module,
                f"`{name}` built without `capturable=True`",
                f"pass `capturable=True` to `{name}` (graphify rewrite sets it on the param groups before warmup)",
            )
        elif name in NEVER_CAPTURABLE or (name == "Adagrad" and not fused):
            hint = (
                "pass `fused=True` (graph-safe on CUDA)"
                if name == "Adagrad"
                else "use an optimizer that supports capture (Adam/AdamW with `capturable=True`, SGD)"
            )
            yield ck.finding_at(NEVER_CAPTURABLE_RULE, call, module, f"`{name}` cannot be captured in a CUDA graph", hint)
    tensor_lr = None
    for node, site in ck.nodes():
        env = site.env
        m = method_call(node)
        if m is not None and m[1] in _SCHEDULER_STEPS and env.kind_of(m[0]) == SCHEDULER:
            tensor_lr = ck.optimizers_take_tensor_lr() if tensor_lr is None else tensor_lr
            cycles = _cycles_momentum(ck, m[0], env)
            if cycles:
                yield ck.finding(
                    SCHEDULER_STEP,
                    node,
                    site,
                    f"`{code_of(node)}` also cycles momentum/betas every step, which capture freezes",
                    "pass `cycle_momentum=False`, or step this scheduler per epoch",
                    False,
                )
                continue
            yield ck.finding(
                SCHEDULER_STEP,
                node,
                site,
                f"`{code_of(node)}` changes the learning rate every step",
                _lr_fix(tensor_lr),
                tensor_lr and _outside_called_step(ck, site) and m[1] == "step",  # the rewrite knows torch's schedulers only
            )
        elif isinstance(node, cst.Call) and not _followed(ck, node) and (what := _unseen_lr_update(node, site, env)):
            yield ck.finding(
                LR_ASSIGNMENT,
                node,
                site,
                f"`{code_of(node)}` {what} every step",
                _lr_fix(False),
                False,
            )
        elif isinstance(node, cst.Assign) and any(_is_lr_subscript(t.target) for t in node.targets):
            tensor_lr = ck.optimizers_take_tensor_lr() if tensor_lr is None else tensor_lr
            yield ck.finding(
                LR_ASSIGNMENT,
                node,
                site,
                f"`{code_of(node)}` sets a float learning rate inside the step",
                _lr_fix(tensor_lr),
                tensor_lr and _outside_called_step(ck, site),
            )


def _unseen_lr_update(call: cst.Call, site, env) -> str | None:
    """A call that sets the learning rate in code graphify does not see (another file, a library): a callable
    scheduler called for its effect (`scheduler(step)`, as open_clip's), or a helper named for it handed an
    optimizer (`adjust_learning_rate(optimizer, it)`, `optimizer.step_and_update_lr()`)."""
    func = call.func
    if isinstance(func, (cst.Name, cst.Attribute)) and env.kind_of(func) == SCHEDULER and isinstance(site.ancestors[-1], cst.Expr):
        return "calls a learning-rate scheduler, which sets the optimizer's float learning rate,"
    name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""
    if not _LR_SETTER.search(name):
        return None
    handed = [a.value for a in call.args] + ([func.value] if isinstance(func, cst.Attribute) else [])
    return "sets the optimizer's float learning rate" if any(env.kind_of(e) == OPTIMIZER for e in handed) else None


def _followed(ck, call: cst.Call) -> bool:
    """Whether the step's walk entered the function this call runs (its LR assignments are then seen there)."""
    region = ck.region
    return any(b.call is call for b in region.blocks) or any(c is call for calls in region.repeats.values() for c, _ in calls)


def _outside_called_step(ck, site) -> bool:
    """In the loop body the rewrite runs the LR update between replays; inside a function the step calls
    it would run only once, at capture."""
    return site.block is ck.region.body_block


def _cycles_momentum(ck, scheduler, env) -> bool:
    built = ck.construction(scheduler, env)
    if built is None:
        return False
    call, module = built
    name = (module.aliases.qualify(call.func) or "").rsplit(".", 1)[-1]
    return name in ("OneCycleLR", "CyclicLR") and not _is_false(kwarg(call, "cycle_momentum"))


def _is_false(expr) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "False"


def _lr_fix(tensor_lr: bool) -> str:
    if tensor_lr:
        return "keep the learning rate in a device tensor (`lr=torch.tensor(lr, device=...)`) and update it outside the graph"
    return "this optimizer reads its learning rate on the host: use Adam/AdamW (capturable) or `fused=True`, or keep the LR fixed"


def _is_lr_subscript(target) -> bool:
    if not isinstance(target, cst.Subscript):
        return False
    return any(
        isinstance(el.slice, cst.Index) and isinstance(el.slice.value, cst.SimpleString) and el.slice.value.value.strip("'\"") == "lr"
        for el in target.slice
    )
