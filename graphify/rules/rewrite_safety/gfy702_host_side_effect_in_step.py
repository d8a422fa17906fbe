"""GFY702 host-side-effect-in-step."""

import re

import libcst as cst

from graphify.analysis.calls import is_model_call, is_periodic_gpu_branch, is_step_op, iter_nodes, method_call
from graphify.analysis.checker import code_of
from graphify.analysis.names import dotted
from graphify.analysis.randomness import is_host_draw
from graphify.analysis.statements import does_gpu_work, unguarded
from graphify.analysis.vocabulary import ENV
from graphify.model import Applicability, Fix, FixKind
from graphify.rules.registry import rule
from graphify.rules.rewrite_safety.shared import after_first_gpu_work, statement_position

RULE = rule(
    "GFY702",
    "host-side-effect-in-step",
    "rewrite-safety",
    "error",
    "the step calls something with host side effects (`next`, `random`, numpy RNG, time, I/O); capture would run it once",
    True,  # only host draws that build the step's inputs: the rewrite draws them before each replay
    Fix(
        FixKind.FETCHED,
        Applicability.SAFE,
        advice="fetch batches and draw host random numbers before the step; draw random numbers on the device inside it",
    ),
)


ENV_METHODS = {"step", "reset", "step_async", "step_wait", "render"}  # a (gym) environment simulating on the host
_BUFFER_METHODS = {"add", "sample", "push", "extend", "store"}
_BUFFER_CLASS = re.compile(r"\w*(Replay|Rollout)(Buffer|Memory)$")
_BUFFER_NAME = re.compile(r"^(self\.)?(rb|replay_buffer|replay_memory|rollout_buffer)$")


def _is_replay_buffer(ck, receiver: cst.BaseExpression, env) -> bool:
    if env.is_tensor(receiver):
        return False
    built = ck.construction(receiver, env)
    if built is not None:
        call, module = built
        return bool(_BUFFER_CLASS.match((module.aliases.qualify(call.func) or "").rsplit(".", 1)[-1]))
    return bool(_BUFFER_NAME.match(dotted(receiver) or ""))


def _host_interaction(ck, call: cst.Call, env) -> str | None:
    """What an environment step or a replay-buffer call does on the host, or None."""
    m = method_call(call)
    if m is None:
        return None
    if m[1] in ENV_METHODS and env.kind_of(m[0]) == ENV:
        return "runs the environment on the host"
    if m[1] in _BUFFER_METHODS and _is_replay_buffer(ck, m[0], env):
        return "draws from a host replay buffer" if m[1] == "sample" else "writes a host replay buffer"
    return None


def _decides_gpu_work(node: cst.CSTNode, site) -> bool:
    """In the test of an `if` that launches GPU work in one of its branches, or in a branch without GPU
    work whose alternative has some (an epsilon-greedy action drawn on the host instead of the policy's)."""
    branch = next((a for a in reversed(site.ancestors) if isinstance(a, cst.If)), None)
    if branch is None:
        return False
    if any(n is node for n in iter_nodes(branch.test)):
        return does_gpu_work(branch.body, site.env) or (branch.orelse is not None and does_gpu_work(branch.orelse, site.env))
    if branch.orelse is None:
        return False
    inside, other = (branch.body, branch.orelse) if any(a is branch.body for a in site.ancestors) else (branch.orelse, branch.body)
    return does_gpu_work(other, site.env) and not does_gpu_work(inside, site.env)


def _draws_step_input(ck, node: cst.CSTNode, site) -> bool:
    """Drawn where the rewrite leaves it eager: every way the loop body reaches it lies in a statement
    before the one that starts the step's work, and after one that already does GPU work (a device copy,
    zero_grad)."""
    if ck.first_gpu_position >= len(ck.region.nodes):
        return False
    first = statement_position(ck, *ck.region.nodes[ck.first_gpu_position])
    anchors = [node] if site.block is ck.region.body_block else ck.region.body_calls_of(site)
    at = [statement_position(ck, a, ck.region.nodes[ck.position(a)][1]) for a in anchors]
    if not at or max(at) >= first:
        return False
    body = unguarded(ck.loop.node.body.body) if isinstance(ck.loop.node.body, cst.IndentedBlock) else ()
    before = [s for s in body if ck.position(s) <= min(at)][:-1]
    return any(does_gpu_work(s, ck.body_env) for s in before)


def _host_random_draws(ck):
    """Python or numpy RNG drawn inside the step. After its first GPU work, or deciding whether GPU work
    runs, capture draws once and every replay repeats that outcome. Between the step's first GPU
    statements and its first model call (noise drawn after `zero_grad()`), the draw builds the step's
    inputs: the rewrite draws it before each replay. Draws before any GPU work fetch the batch and are not
    reported."""
    for node, site in ck.nodes():
        if not isinstance(node, cst.Call) or not is_host_draw(node, site.env):
            continue
        if any(isinstance(a, cst.If) and is_periodic_gpu_branch(a, site.env) for a in site.ancestors):
            continue  # evaluation or sampling every N steps runs eagerly between replays (GFY502)
        message = f"`{code_of(node)}` draws a host random number in the step; capture would draw it once"
        if after_first_gpu_work(ck, node, site) or _decides_gpu_work(node, site):
            yield ck.finding(RULE, node, site, message, RULE.fix.advice, False, order=(0,))
        elif _draws_step_input(ck, node, site):
            yield ck.finding(
                RULE, node, site, message, "graphify rewrite draws it before each replay; or draw it on the device", order=(0,)
            )


def _host_interactions(ck):
    """An environment step or a replay-buffer call after the step has run a model and before its last
    backward/optimizer step (an RL loop acting, storing and sampling between the policy's forward and the
    update; for inference, before its last model call): capture would run it once. Before the model runs
    such calls fetch the step's inputs, after the step they use its outputs: both stay eager."""
    models = steps = None
    for node, site in ck.calls():
        what = _host_interaction(ck, node, site.env)
        if what is None:
            continue
        if models is None:
            models = [statement_position(ck, n, s) for n, s in ck.calls() if is_model_call(n, s.env)]
            steps = [statement_position(ck, n, s) for n, s in ck.calls() if is_step_op(n, s.env)] if ck.loop.kind == "train" else models
        here = statement_position(ck, node, site)
        if any(p < here for p in models) and any(p > here for p in steps):
            message = f"`{code_of(node)}` {what} in the step; capture would run it once"
            yield ck.finding(RULE, node, site, message, RULE.fix.advice, False, order=(1,))


def detect(ck):
    yield from _host_random_draws(ck)
    yield from _host_interactions(ck)


CASES = {
    "host-random-branch": (
        """
        for x, y in loader:
            if random.random() < 0.1:  # here
                x = x.flip(0)
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
            keep = np.random.rand() < 0.5  # here
        """,
        """
        for x, y in loader:
            scale = np.random.uniform(0.9, 1.1)
            x = x * scale
            criterion(model(x), y).backward()
            opt.step(); opt.zero_grad()
        """,
        False,
    ),
    "rl-env-and-replay-buffer": (
        """
        import gymnasium as gym
        from stable_baselines3.common.buffers import ReplayBuffer
        envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
        rb = ReplayBuffer(1000, envs.single_observation_space, envs.single_action_space, "cuda")
        obs, _ = envs.reset()
        for step in range(1000):
            if step < 100:
                actions = envs.single_action_space.sample()  # here
            else:
                q_values = model(torch.Tensor(obs))
                actions = q_values.argmax(1).numpy()
            next_obs, rewards, terms, truncs, infos = envs.step(actions)  # here
            rb.add(obs, next_obs, actions, rewards, terms, infos)  # here
            obs = next_obs
            data = rb.sample(32)  # here
            criterion(model(data.observations), data.actions).backward()
            opt.step(); opt.zero_grad()
        """,
        """
        import gymnasium as gym
        env = gym.make("CartPole-v1")
        obs, _ = env.reset()
        with torch.no_grad():
            for step in range(1000):
                action = model(torch.Tensor(obs)).argmax().item()
                obs, reward, term, trunc, info = env.step(action)
                if term or trunc:
                    obs, _ = env.reset()
        """,
        False,
    ),
    "noise-drawn-after-zero-grad": (
        """
        for x, y in loader:
            opt.zero_grad()
            z = torch.from_numpy(np.random.normal(0, 1, (8, 4))).float()  # here
            criterion(model(z), y).backward()
            opt.step()
        """,
        """
        for x, y in loader:
            z = torch.from_numpy(np.random.normal(0, 1, (8, 4))).float()
            opt.zero_grad()
            criterion(model(z), y).backward()
            opt.step()
        """,
        True,
    ),
}

DOC = """\
# GFY702 host-side-effect-in-step

*Category: rewrite-safety · Severity: error · Removed by `graphify rewrite`: when a host draw builds the step's inputs before its model runs, or a batch is fetched before anything else of the step runs or once in each pass of a micro-step loop*

## What it flags

A call with effects on the host in the statements `graphify rewrite` would capture, or in a function or `forward`
they call (`next(iterator)`, `random`, `numpy.random`, `time`, `os`, file I/O, `iter`, `setattr`), reported by the
planner at every statement where it finds one, even when another breaker already blocks the loop. Also, wherever the loop stands: Python, numpy or gym-space (`env.action_space.sample()`) draws
after the step's first GPU work, or deciding whether GPU work runs (`if random.random() < eps:` choosing the policy,
or the host action drawn in its place); an environment's `step`/`reset` or a replay buffer's `add`/`sample` between
the policy's forward and the update. A draw after the loop body's first GPU work but before the model runs (noise
after `zero_grad()`) builds the step's inputs: the rewrite draws it before each replay. Not flagged: the same calls
before any GPU work (fetching the batch at the top of the loop body is the normal place), or in periodic evaluation
(GFY502).

Removed by the rewrite: `next(it)` run before anything else of the step, fetched just
before each replay; `next(it)` once in each pass of a micro-step loop (`for _ in range(k)` that runs every pass),
which becomes `batches = train_step.fetch(lambda: next(loader), k)` read as `batches[_]`: fetched in pass order
while the step runs eagerly (on a CPU, where dropout shares the host generator with the fetch, and in warmup),
all k before a replay once warmup showed that fetching leaves the CUDA generator alone (else eager, one warning).

## Why it breaks capture

Capture runs the step's Python once and replays only its GPU work. A batch taken with `next()` inside the step
is taken once: every replay trains on it again. A coin flipped with `random.random()` in `forward` is flipped
once: every replay takes the same branch.

## How to fix

Fetch batches and draw host random numbers before the step and pass them in as tensors; draw random numbers
on the device (`torch.rand(..., device="cuda")`), which capture replays correctly.

## Example

Flagged:
```python
for step in range(num_steps):
    features = model(next(images).to(device))
    captions = next(texts).to(device)  # fetched after the forward pass
    loss = criterion(features, captions)
    loss.backward(); opt.step(); opt.zero_grad()
```
Instead:
```python
for step in range(num_steps):
    x, captions = next(images).to(device), next(texts).to(device)  # before the step: its inputs
    features = model(x)
    loss = criterion(features, captions)
    loss.backward(); opt.step(); opt.zero_grad()
```

## Suppress

`# graphify: ignore[GFY702]` hides the diagnostic from `check`; the rewrite still leaves the loop alone.
"""
