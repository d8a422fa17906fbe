"""The runtime as a state machine: the phases a graph key goes through, the state both wrappers keep (one
KeyState per key), their one guard and their one way to give up, and the registry of their states.

A key is what one graph is valid for: for CapturedStep the rewrite's host branch outcomes, the host
inputs, whether grad is enabled and the modules' modes; for GraphedModule the call's shapes, dtypes,
autocast setting and keyword values. Each call on CUDA runs in its key's phase:

      +---------------------------------------------------------+  a host value, a module or another setting
      v                                                         |  moved (a step): warmed up again
    WARMUP -> RECORD -> RECORD -> TIMED -> CAPTURE -> CAPTURED -+
                                              ^                 |  a learning rate moved, or a `.grad` the
                                              +-----------------+  graph would overwrite (a step): captured again
    any phase --(a reason: one GraphifyFallbackWarning)--> EAGER, for good, every key of the wrapper

* WARMUP: eager calls on the side stream, counted per key (`warmup` of them, 11 for a DDP step);
* RECORD: the two warmup calls before the last record the host values the work hands to the GPU; the
  second must find what the first found, or the wrapper gives up (GRAPHIFY_HOST_CHECK=off, or a DDP
  step: no RECORD calls, one warmup call fewer);
* TIMED: the last warmup call. Until the first capture every warmup call but a key's first is timed, its
  host time against its GPU time (common.WarmupLoad, the RECORD calls marked as slowed by the recorder):
  the first CAPTURE call asks whether the work is GPU-bound, when a graph would gain nothing: GPU_BOUND_CALLS
  calls GPU-bound and no unrecorded one not, and the wrapper runs eagerly for good; too few to tell, and
  the CAPTURE call runs eagerly, timed, asking again at the next (GRAPHIFY_CAPTURE=always: not asked);
* CAPTURE: the graph is recorded, and replayed once for this call (a model's waits while the last warmup
  call's backward is still to come: one TIMED call more);
* CAPTURED: calls replay, in turns with eager calls while the loop trial runs after the first capture
  (common.LoopTrial: replays no faster there give up); inputs that do not fit run eagerly; a few replays
  run recorded instead and are compared with the RECORD calls (KeyState.count_replay): a value moved
  sends a step's key back to WARMUP, a model to EAGER;
* EAGER: the wrapper runs eagerly for good, its graphs dropped, with one warning naming the cause.

Before each call a wrapper passes one guard (GraphStates.guard): the tensors and forwards the graphs were
captured on must still be there (a checkpoint's optimizer state, pruning), or a step warms up again and a
model gives up. A wrapper built again (its loop entered again, the next epoch) finds its state in the
registry, and checks each graph at its next replay.
"""

from __future__ import annotations

import contextlib
import enum
import sys
import time
import warnings
import weakref
from dataclasses import dataclass, field

from graphify.runtime.common import GraphifyFallbackWarning, WarmupLoad, capture_forced
from graphify.runtime.host_values import RECHECK_FROM
from graphify.runtime.reach import layout, layout_change, registrations

# A periodic check runs a replay eagerly under the recorder, which costs many replays on a short step: it
# waits until the loop has run 1/MAX_CHECK_SHARE times that cost since the last check, so that checks take at
# most that share of the run (a check on entering the loop again does not wait).
MAX_CHECK_SHARE = 0.02
clock = time.perf_counter


class Phase(enum.Enum):
    WARMUP = "warmup"
    RECORD = "record"
    TIMED = "timed"
    CAPTURE = "capture"
    CAPTURED = "captured"
    EAGER = "eager for good"


def warmup_phase(runs: int, warmup: int, recorded: bool) -> Phase:
    """The phase of a key's call after `runs` warmup calls, of the `warmup` it runs before its capture
    (its RECORD calls counted in when `recorded`)."""
    if runs >= warmup:
        return Phase.CAPTURE
    if recorded and runs in (warmup - 3, warmup - 2):
        return Phase.RECORD
    if runs == warmup - 1:
        return Phase.TIMED
    return Phase.WARMUP


@dataclass(eq=False)
class KeyState:
    """One key's life: its warmup calls, the host values they recorded, its graph, its replays and the
    record of the checks that its replays still do what an eager call would."""

    eager_runs: int = 0  # warmup calls (WARMUP, RECORD, TIMED); kept when a graph is dropped for a learning rate
    host_values: list | None = None  # the operators' arguments of its last recorded call
    graph: object = None  # while CAPTURED: its graph and what replays need (a step's CapturedGraph, a model's ModuleGraph)
    replays: int = 0  # since its capture (kept when the graph is dropped for a learning rate)
    checked: int = 0  # the replay at which it was last run recorded and compared
    entry_checked: int = 0  # the replay at which it was last so checked on entering its loop again
    recheck: bool = False  # its loop was entered again: its next replay is checked, if RECHECK_FROM replays ran since
    check_cost: float = 0.0  # host seconds its last recorded call took: what a check costs
    checked_at: float | None = None  # clock() when its last check (or recorded call) ended, or its replays began

    def phase(self, warmup: int, recorded: bool) -> Phase:
        return Phase.CAPTURED if self.graph is not None else warmup_phase(self.eager_runs, warmup, recorded)

    def count_replay(self, recorded) -> tuple[bool, bool]:
        """A replay starts: (whether it runs recorded instead, to check the host values: the first after
        the loop is entered again if RECHECK_FROM replays ran since the last such check, a recorded call
        costing many replays; and periodically, from the 128th replay on, each at twice the replays of the
        last check (128th, 256th, 512th, ...) or later, once the loop has run long enough that checks take
        at most MAX_CHECK_SHARE of it; whether it is the one after an entry)."""
        n = self.replays = self.replays + 1
        if n == 1 or self.checked_at is None:
            self.checked_at = clock()
        entered = self.recheck and n - self.entry_checked >= RECHECK_FROM
        self.recheck = False
        # the clock is read only once the count allows a check: it runs before every replay
        due = n >= max(RECHECK_FROM, 2 * self.checked) and clock() - self.checked_at >= self.check_cost / MAX_CHECK_SHARE
        return bool(recorded) and (entered or due), entered

    @contextlib.contextmanager
    def recording(self):
        """A recorded call of this key (a RECORD call of its warmup, or a check): its host time is what the
        next check is taken to cost."""
        started = clock()
        try:
            yield
        finally:
            self.checked_at = clock()
            self.check_cost = self.checked_at - started

    def start_check(self, entered: bool) -> int:
        """A replay run recorded and compared: how many replays ran since the last check, before this one."""
        n, last = self.replays, self.checked
        self.checked = n
        if entered:
            self.entry_checked = n
        return n - last - 1

    def forget(self, warm: bool) -> None:
        """The graph dropped; unless `warm` (a learning rate moved: the warmup still holds), the key warms up again."""
        self.graph = None
        if not warm:
            self.eager_runs = self.replays = self.checked = self.entry_checked = 0
            self.checked_at = None


@dataclass(eq=False)
class GraphStates:
    """What a wrapper keeps across its calls and its loop's re-entries: a KeyState per key, and what holds
    for all of them."""

    keys: dict = field(default_factory=dict)  # key -> KeyState
    disabled: str | None = None  # why it runs eagerly for good (EAGER)
    recorded: bool | None = None  # whether its keys have RECORD calls; None until decided
    layout: tuple = ()  # of the modules' and optimizers' tensors and forwards at the last capture (reach.layout)
    registrations: tuple = ()  # reach.registrations() when the layout was last found the same
    load: WarmupLoad | None = field(default_factory=WarmupLoad)  # timed warmup calls; None once decided
    trial: object = None  # the LoopTrial under way after the first capture
    trial_costs: tuple | None = None  # (eager ms, replay ms) a call, as the trial measured them

    def phase(self, key, warmup: int) -> Phase:
        """The phase the next call of `key` runs in."""
        return self.phase_of(self.keys.get(key), warmup)

    def phase_of(self, entry: KeyState | None, warmup: int) -> Phase:
        """The phase the next call of the key of `entry` (None: a key not warmed up yet) runs in."""
        if self.disabled is not None:
            return Phase.EAGER
        return entry.phase(warmup, bool(self.recorded)) if entry is not None else warmup_phase(0, warmup, bool(self.recorded))

    def warm(self, key, limit: int) -> int | None:
        """Counts a warmup call of `key`: the calls it had before, or None when it would be the key
        warmed beyond `limit` (a host value that changes every call: graphs would rarely replay)."""
        entry = self.keys.get(key)
        if (entry is None or not entry.eager_runs) and sum(1 for e in self.keys.values() if e.eager_runs) >= limit:
            return None
        entry = self.entry(key)
        entry.eager_runs += 1
        return entry.eager_runs - 1

    def entry(self, key) -> KeyState:
        entry = self.keys.get(key)
        if entry is None:
            entry = self.keys[key] = KeyState()
        return entry

    @property
    def graphs(self) -> dict:
        """key -> graph, for the keys CAPTURED."""
        return {key: entry.graph for key, entry in self.keys.items() if entry.graph is not None}

    def guard(self, always: bool = False) -> str | None:
        """What changed in the tensors and forwards the graphs were captured on, in words, or None: checked
        before each call, where it compares them only once a hook, parameter, buffer or submodule was
        registered somewhere since, and whenever the wrapper is built again (`always`)."""
        if self.disabled is not None or (not always and registrations() == self.registrations):
            return None
        if all(entry.graph is None for entry in self.keys.values()):
            return None
        return self.layout_moved()

    def captured_on(self) -> tuple[list, list]:
        """(the modules, the optimizers) the graphs run: their layout is what the guard compares."""
        return [], []

    def record_layout(self) -> None:
        """What the graph just captured runs on: the modules' tensors and forwards (reach.layout)."""
        self.layout, self.registrations = layout(*self.captured_on()), registrations()

    def layout_moved(self) -> str | None:
        """What changed in the tensors and forwards the graphs were captured on, in words, or None."""
        self.registrations = registrations()
        now = layout(*self.captured_on())
        return None if now == self.layout else layout_change(self.layout, now)

    def entered_again(self) -> None:
        """The wrapper was built again: its loop was entered again (the next epoch). Each graph is checked
        at its next replay, and the loop trial does not count the time since the last call as a call's."""
        if self.recorded:
            for entry in self.keys.values():
                entry.recheck = entry.graph is not None
        if self.trial is not None:
            self.trial.restart()

    def stop(self, why: str) -> None:
        """EAGER: for good, every graph dropped (without a warning: Wrapper._give_up warns)."""
        for entry in self.keys.values():
            entry.graph = None
        self.disabled = why


class Wrapper:
    """What CapturedStep and GraphedModule share: their state, the loop trial's turns, and the one way
    they give up: eager for good, with one warning at the line of the user's code that called them."""

    state: GraphStates
    subject = "the model"  # who runs eagerly, in the warning

    def _give_up(self, why: str) -> None:
        """EAGER for good: the graphs dropped, what the capture changed handed back (_release), one warning."""
        self.state.stop(why)
        self._release()
        self._warn(why)

    def _release(self) -> None:
        """What giving up hands back besides the graphs."""

    def _warn(self, why: str, outcome: str = "runs eagerly") -> None:
        """One warning, shown at the line that called the wrapper: the first frame out of its own methods.
        The walk starts at the caller's frame: this one's locals, read, would hold this frame itself, and
        with it its callers' frames and their tensors, in a reference cycle until the next collection."""
        level, frame = 2, sys._getframe(1)
        while frame is not None and frame.f_locals.get("self") is self:  # this wrapper's own frames
            level, frame = level + 1, frame.f_back
        del frame
        warnings.warn(f"graphify: {self.subject} {outcome}: {why}", GraphifyFallbackWarning, stacklevel=level)

    def _timed(self, runs: int) -> bool:
        """Whether a warmup call, after `runs` of its key, is timed: until the capture decision, all but a
        key's first (lazy loading, cuDNN's autotuning), unless GRAPHIFY_CAPTURE=always."""
        return runs > 0 and self.state.load is not None and not capture_forced()

    def _load_verdict(self, what: str) -> str:
        """At a CAPTURE call, before the first capture: "capture"; "time" (GPU-bound so far, too few calls
        to tell: this call runs eagerly, timed, and the next asks again); or "eager": the timed warmup calls
        found `what` GPU-bound (common.WarmupLoad), and the wrapper gave up, with one warning. Decided once."""
        load = self.state.load
        if load is None or capture_forced():
            self.state.load = None
            return "capture"
        verdict, why = load.verdict(what)
        if verdict != "time":
            self.state.load = None  # decided: no call is timed any more
        if why is not None:
            self._give_up(why)
        return verdict

    def _trial_turn(self, what: str) -> str:
        """Whether this call, which could replay, replays or runs eagerly: eagerly in the eager turns of the
        loop trial after the first capture (common.LoopTrial), and for good once the trial found replays of
        `what` no faster than eager calls in this loop."""
        state = self.state
        trial = state.trial
        if trial is None:
            return "replay"
        kind = trial.begin()
        if kind is not None:
            return kind
        state.trial, state.trial_costs = None, trial.costs()
        why = trial.verdict(what)
        if why is None:
            return "replay"
        self._give_up(why)
        return "eager"


class Registry:
    """The states of the wrappers built so far, found again by the next wrapper of the same step (function
    and the objects it refers to) or model: a loop entered again (a `train()` called once per epoch) builds
    its wrappers again and replays the graphs captured before. `reset()` forgets them all (tests)."""

    def __init__(self):
        self.steps: dict = {}  # a step function's code object -> the states of its latest bindings, newest last
        self.modules: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> its state, while it lives

    def step_state(self, code, found, make, kept: int) -> tuple:
        """(the state of a step whose `found(state)`, or a new one from `make()`; whether it is new). At
        most `kept` states per step function (one train() called in turn for a few models)."""
        states = self.steps.setdefault(code, [])
        state = next((s for s in states if found(s)), None)
        if state is not None:
            return state, False
        state = make()
        states.append(state)
        del states[:-kept]
        return state, True

    def module_state(self, module, make) -> tuple:
        """(the state of `module`, or a new one from `make()`; whether it is new)."""
        state = self.modules.get(module)
        if state is not None:
            return state, False
        state = self.modules[module] = make()
        return state, True

    def capturing_optimizers(self) -> list:
        """The optimizers of the steps not left eager: their capture settings stay."""
        return [o for states in self.steps.values() for s in states if s.disabled is None for o in s.optimizers]

    def reset(self) -> None:
        self.steps.clear()
        self.modules.clear()


registry = Registry()
