"""Objects known by their names when their construction is out of sight (built in another file)."""

import pytest

import libcst as cst

from graphify.analysis.program import Program
from graphify.analysis.vocabulary import MODEL, OPTIMIZER, SCALER, SCHEDULER, kind_by_name
from graphify.rewrite import rewrite_source


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("optimizer", OPTIMIZER),
        ("self.opt_g", OPTIMIZER),
        ("self.policy.optimizer", OPTIMIZER),  # stable-baselines3 keeps it on the policy
        ("trainer.optimizer", OPTIMIZER),
        ("args.optimizer", None),  # a command-line choice, a string
        ("cfg.optim.optimizer", None),
    ],
)
def test_optimizer_names(name, kind):
    assert kind_by_name(name) == kind


@pytest.mark.parametrize(
    ("construction", "kind"),
    [
        ("timm.optim.create_optimizer_v2(model, opt='adamw')", OPTIMIZER),  # not a model, though timm's
        ("timm.scheduler.create_scheduler(args, optimizer)", SCHEDULER),
        ("timm.utils.NativeScaler()", SCALER),
        ("timm.create_model('resnet50')", MODEL),
        ("build_model(cfg)", MODEL),
        ("make_dataset(cfg)", None),
        ("get_device()", None),
    ],
)
def test_objects_built_by_factories(construction, kind):
    source = f"import timm\nimport timm.optim, timm.scheduler, timm.utils\nobj = {construction}\n"
    module = Program().add("m.py", source, cst.parse_module(source))
    env = module.function_info(None, None).new_env()
    assert env.kind_of(cst.parse_expression("obj")) == kind


def test_an_optimizer_held_by_the_policy_zeroes_its_gradients_inside_the_step(settings):
    source = """import torch
import torch.nn.functional as F


class Learner:
    def train(self, gradient_steps, batch_size):
        losses = []
        for _ in range(gradient_steps):
            batch = self.buffer.sample(batch_size)
            q = self.q_net(batch.observations)
            loss = F.smooth_l1_loss(q, batch.targets)
            losses.append(loss.item())
            self.policy.optimizer.zero_grad()
            loss.backward()
            self.policy.optimizer.step()
"""
    result = rewrite_source(source, "learner.py", settings)
    assert result.outcomes[0].rewritten, result.outcomes[0].reasons
    step = result.code[result.code.index("def train_step") : result.code.index("train_step = CapturedStep")]
    assert "self.policy.optimizer.zero_grad()" in step and "self.policy.optimizer.step()" in step
