"""The loop trial (runtime/common.py LoopTrial): after a capture, replayed and eager calls in turns in the
user's loop, each call's period timed; the graphs are kept only when replayed calls are clearly faster.
Fake clocks stand in for the GPU here; tests/gpu/test_never_slower_gpu.py runs the helpers on CUDA."""

from __future__ import annotations

import pytest

from graphify.runtime.common import MIN_LOOP_GAIN, TRIAL_BLOCK, TRIAL_BLOCKS, LoopTrial, slower_in_loop


class FakeLoop:
    """A loop whose calls take `replay_ms` or `eager_ms` of host time (and, with `gpu`, of GPU time too)."""

    def __init__(self, eager_ms, replay_ms, gpu_eager_ms=None, gpu_replay_ms=None):
        self.now = 0.0
        self.gpu_now = 0.0
        self.times = {"eager": eager_ms, "replay": replay_ms}
        self.gpu = {"eager": gpu_eager_ms, "replay": gpu_replay_ms} if gpu_eager_ms is not None else None
        use_gpu = self.gpu is not None
        self.trial = LoopTrial(clock=lambda: self.now, event=(lambda: FakeEvent(self.gpu_now)) if use_gpu else None)

    def run(self, calls):
        """Calls the loop makes until the trial is over; returns the kinds they ran."""
        kinds = []
        for _ in range(calls):
            kind = self.trial.begin()
            if kind is None:
                return kinds
            kinds.append(kind)
            self.now += self.times[kind] / 1e3
            if self.gpu is not None:
                self.gpu_now += self.gpu[kind]
        return kinds


class FakeEvent:
    def __init__(self, at_ms):
        self.at_ms = at_ms

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return end.at_ms - self.at_ms


def test_the_trial_runs_turns_of_replayed_and_eager_calls_then_decides():
    loop = FakeLoop(eager_ms=2.0, replay_ms=1.0)
    kinds = loop.run(100)
    assert len(kinds) == TRIAL_BLOCK * TRIAL_BLOCKS
    assert kinds[:TRIAL_BLOCK] == ["replay"] * TRIAL_BLOCK and kinds[TRIAL_BLOCK : 2 * TRIAL_BLOCK] == ["eager"] * TRIAL_BLOCK
    assert kinds.count("eager") == kinds.count("replay")
    # the first call of each turn follows the switch: not counted
    assert len(loop.trial.periods["eager"]) == len(loop.trial.periods["replay"]) == (TRIAL_BLOCK - 1) * TRIAL_BLOCKS // 2
    assert loop.trial.costs() == pytest.approx((2.0, 1.0))
    assert loop.trial.verdict("a step") is None


def test_replays_slower_in_the_loop_leave_it_eager_with_a_reason_verify_reads():
    loop = FakeLoop(eager_ms=1.0, replay_ms=1.25)
    loop.run(100)
    why = loop.trial.verdict("a step")
    assert why.startswith("no gain expected: measured in its loop, a step took 1.250 ms a call replayed and 1.000 ms eager")
    assert "GRAPHIFY_CAPTURE=always" in why


def test_a_gain_within_noise_is_not_kept():
    assert slower_in_loop(1.02, 1.0, "x", 9) is not None  # 2% is noise: eager
    assert slower_in_loop(MIN_LOOP_GAIN * 1.0, 1.0, "x", 9) is None


def test_the_gpu_clock_counts_when_the_host_runs_ahead():
    """Launches queue up: the host returns at once, the GPU sets the pace. Replays that launch fast but
    keep the GPU busier (input copies) are slower, though their host periods are shorter."""
    loop = FakeLoop(eager_ms=0.3, replay_ms=0.05, gpu_eager_ms=4.0, gpu_replay_ms=4.4)
    loop.run(100)
    eager, replay = loop.trial.costs()
    assert (eager, replay) == pytest.approx((4.0, 4.4))
    assert loop.trial.verdict("its forward and backward") is not None


def test_the_host_clock_counts_when_the_gpu_waits_for_it():
    """Launch-bound: the GPU waits on the host between kernels, and its periods follow the host's."""
    loop = FakeLoop(eager_ms=3.0, replay_ms=1.0, gpu_eager_ms=0.5, gpu_replay_ms=0.5)
    loop.run(100)
    assert loop.trial.costs() == pytest.approx((3.0, 1.0))
    assert loop.trial.verdict("a step") is None


def test_outliers_do_not_decide():
    """A checkpoint or an evaluation run between two calls makes one period long: medians ignore it."""
    loop = FakeLoop(eager_ms=2.0, replay_ms=1.0)
    trial = loop.trial
    for i in range(TRIAL_BLOCK * TRIAL_BLOCKS + 1):
        kind = trial.begin()
        if kind is None:
            break
        loop.now += (500.0 if i == 2 else loop.times[kind]) / 1e3  # a replayed call followed by a checkpoint
    assert trial.costs() == pytest.approx((2.0, 1.0))
    assert trial.verdict("a step") is None


def test_a_loop_entered_again_does_not_count_the_time_between_entries():
    loop = FakeLoop(eager_ms=1.0, replay_ms=0.5)
    trial = loop.trial
    for call in range(TRIAL_BLOCK * TRIAL_BLOCKS + 1):
        kind = trial.begin()
        if kind is None:
            break
        loop.now += loop.times[kind] / 1e3
        if call % 5 == 4:  # an evaluation loop of five batches, entered once per epoch
            loop.now += 30.0  # the epoch's training
            trial.restart()
    assert max(h for periods in trial.periods.values() for h, _ in periods) < 2.0
    assert trial.verdict("a step") is None


def test_too_few_periods_keep_the_graphs():
    """One call per entry of the loop (a full-batch step per epoch): no period is measured, nothing is decided."""
    loop = FakeLoop(eager_ms=1.0, replay_ms=5.0)
    trial = loop.trial
    while (kind := trial.begin()) is not None:
        loop.now += loop.times[kind] / 1e3
        trial.restart()
    assert trial.periods == {"replay": [], "eager": []}
    assert trial.verdict("a step") is None


def test_the_reason_reads_as_a_fallback_in_verify(monkeypatch):
    """verify's report and scripts/verify-fixtures learn runtime decisions from the fallback warning's text:
    'graphify: `step` runs eagerly: why', and 'no gain expected' marks a decision taken for speed."""
    from graphify.verify.report import speed_verdict

    why = slower_in_loop(1.0, 1.3, "a step", 9)
    message = f"graphify: `train_step` runs eagerly: {why}"

    class Run:
        def __init__(self, data):
            self.data = data

    class Report:
        on_cuda = True
        original = Run({})
        rewrite = Run({"fallbacks": [message]})

    verdict = speed_verdict(Report())
    assert verdict.startswith("the runtime ran `train_step` eagerly (no gain expected: measured in its loop")
