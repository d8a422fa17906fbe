"""What a CapturedStep keeps for one step function across calls and re-entries of its loop: its graphs,
warmup counts, the optimizers and modules it was found to use, and the record its checks compare with."""

from __future__ import annotations

from graphify.runtime.common import Timing


class StepCaptures:
    """Everything captured for one step function: kept across re-entries of its loop."""

    def __init__(self, bindings):
        self.bindings = bindings
        self.addresses: tuple = ()  # of the tensors the graphs were captured with (reach.tensor_addresses)
        self.inspected = False
        self.disabled: str | None = None  # why the step runs eagerly for good
        self.side_stream_used = False
        self.optimizers: list = []
        self.made_capturable: list = []  # (optimizer, group) set capturable for the capture: given back if it stays eager
        self.modules: list = []  # top-level modules the step reaches
        self.submodules: list = []  # theirs and every submodule: train/eval modes are part of each graph's key
        self.handed: list = []  # models and optimizers handed to the first call as arguments: the ones inspected
        self.parameters: list = []  # theirs: which require grad is part of each key (freezing, unfreezing)
        self.ddps: list = []  # DistributedDataParallel models the step runs: longer warmup, ranks agree on captures
        self.graphs: dict = {}  # key -> (graph, static input tensors, static outputs, gradients it writes)
        self.grads_of = None  # the graph whose gradient buffers the parameters' `.grad` now are
        self.eager_runs: dict = {}
        self.pool = None
        self.lr_tensors: list = []  # [param group, device tensor, float it holds]
        self.frozen: list = []  # (param group, name, value at capture) the graph cannot follow
        self.group_counts: list = []  # (optimizer, its param groups at capture): a group added later is not in the graph
        # times the graphs were dropped because a value they froze changed; of those, how many within
        # FEW_REPLAYS replays of the last; the sum of `replays` then
        self.recaptures = self.hasty_recaptures = self.replays_at_forget = 0
        self.load: Timing | None = None  # of the last warmup step
        self.fetch_checks: int | None = None  # eager calls that fetched micro-step batches in order; -1 off CUDA
        self.measured: tuple | None = None  # (GPU ms, host ms) of that step, once the capture decision used it
        self.recorded = False  # whether warmup calls record the host values the step hands to the GPU
        self.host_values: dict = {}  # key -> the operators' arguments of its last recorded call
        self.recheck: set = set()  # keys checked again at their next check point: the loop was entered again
        self.replays: dict = {}  # key -> replays since its capture
        self.checked: dict = {}  # key -> the replay at which it was last checked (see _rechecked)
        self.entry_checked: dict = {}  # key -> the replay at which it was last checked after a re-entry
