"""The vocabulary of names: well-known object kinds, the name patterns that suggest them, and the
tensor methods, attributes and torch callables whose results live on the host.
"""

from __future__ import annotations

import re

MODEL, OPTIMIZER, SCHEDULER, SCALER, LOADER, LOSS, DDP, GENERATOR, ENV, ACCELERATOR = (
    "model",
    "optimizer",
    "scheduler",
    "scaler",
    "loader",
    "loss",
    "ddp",
    "generator",
    "env",
    "accelerator",
)

ADAM_FAMILY = {"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "ASGD", "RMSprop", "Adadelta", "Rprop"}
NEVER_CAPTURABLE = {"LBFGS", "SparseAdam"}
FUSED_CAPTURABLE = {"Adagrad", "SGD", "Adam", "AdamW"}  # graph-safe with fused=True
KNOWN_OPTIMIZERS = ADAM_FAMILY | NEVER_CAPTURABLE | {"SGD", "Adagrad", "Adafactor", "Muon"}
# nn.Module methods that return the module itself: `Net().to(device).eval()` is a `Net`
MODULE_RETURNS_SELF = {"to", "cuda", "cpu", "train", "eval", "half", "float", "double", "bfloat16", "requires_grad_"}

# `G` and `D` (a GAN's generator and discriminator) only in capitals: a lowercase `d` or `g` is as often
# a loop variable (`tuple(d.cuda() for d in data)`) or a graph
_MODEL_NAME = re.compile(
    r"^(self\.)?((?i:model|net|network|module|encoder|decoder|generator|discriminator|gen|disc|netG|netD|"
    r"policy|critic|actor|value_net|q_net|qnet|target_net|classifier|backbone|head|ae|autoencoder|vae|unet|"
    r"transformer|gpt|bert|lm|student|teacher|mlp|cnn|rnn|lstm|[a-z_]*_(model|net|encoder|decoder))|G|D)$"
)
_OPTIMIZER_NAME = re.compile(
    r"^(self\.)?(opt|optim|optimizer|optimiser)(_[a-z0-9]+|[GD])?$|^(self\.)?[a-z0-9_]*_(opt|optim|optimizer|optimiser)$"
    r"|^(self|[a-z_]*(model|policy|trainer|agent|learner|module))(\.[a-z_]+)*\.(optimizer|optimiser)$",  # self.policy.optimizer
    re.I,
)
# a diffusion model's noise scheduler (`noise_scheduler.add_noise(...)`) computes tensors; it is no LR scheduler
_SCHEDULER_NAME = re.compile(r"^(self\.)?(?!noise)([a-z_]*sched[a-z_]*|lr_scheduler)$", re.I)
_SCALER_NAME = re.compile(r"^(self\.)?([a-z_]*scaler)$", re.I)
_LOADER_NAME = re.compile(r"^(self\.)?([a-z_]*(loader|_dl|dl_[a-z_]*)|dl|dataloader)$", re.I)
LOSS_NAME = re.compile(r"^(self\.)?(criterion|loss_fn|loss_func|loss_function|lossfn|[a-z_]*_criterion|[a-z_]*_loss_fn)$", re.I)
_ENV_NAME = re.compile(r"^(self\.)?(env|envs|environment|[a-z_]*_env|sim|game)$", re.I)
# helpers that reduce or gather their argument across processes (`utils.reduce_dict(loss_dict)`,
# `reduce_tensor(loss.data, n)`, `concat_all_gather(keys)`): a tensor in, a tensor of the same kind out
COLLECTIVE_HELPER = re.compile(r"(^|_)(reduce|gather)(_|$)")
# names that say a collective whatever they are handed: MPI, all-reduce and all-gather, barriers, gradient averaging
COLLECTIVE_NAME = re.compile(
    r"(^|_)(mpi|allreduce|all_reduce|allgather|all_gather|barrier|avg_grads|average_gradients|sync_grads)(_|$)", re.I
)
SYNC_FLAG = "require_backward_grad_sync"  # DDP's own switch, which `no_sync()` flips
# builtins whose result holds the items of its arguments (`list(zip(a, b))`): tensors if theirs are
SAME_ITEMS = frozenset({"list", "tuple", "sorted", "reversed", "zip"})

# Tensor metadata: what a tensor is (its shape, dtype, device, layout, autograd flags), never what it holds.
# A graph is keyed by its inputs' metadata, so any boolean or arithmetic combination of these is a host
# value fixed per graph, not a data-dependent branch. `is_*` attributes and methods all belong here but one.
TENSOR_METADATA_ATTRIBUTES = {
    "shape",
    "dtype",
    "device",
    "ndim",
    "layout",
    "names",
    "requires_grad",
    "is_leaf",
    "grad_fn",
    "itemsize",
    "nbytes",
}
TENSOR_METADATA_METHODS = {
    "size",
    "dim",
    "ndimension",
    "numel",
    "nelement",
    "element_size",
    "data_ptr",
    "get_device",
    "stride",
    "storage_offset",
    "__len__",
}
_READS_VALUES = {"is_nonzero"}  # an `is_` method that reads the tensor's one value


def is_tensor_metadata_attribute(name: str) -> bool:
    return name in TENSOR_METADATA_ATTRIBUTES or name.startswith("is_")


def is_tensor_metadata_method(name: str) -> bool:
    return name in TENSOR_METADATA_METHODS or (name.startswith("is_") and name not in _READS_VALUES)


# Methods whose results live on the host: tensor metadata, values read back, and the bookkeeping of
# well-known objects (modules, optimizers, loggers, containers).
HOST_METHODS = TENSOR_METADATA_METHODS | {
    "item",
    "tolist",
    "numpy",
    "type",
    "keys",
    "items",
    "values",
    "state_dict",
    "parameters",
    "named_parameters",
    "buffers",
    "modules",
    "children",
    "train",
    "eval",
    "zero_grad",
    "register_hook",
    "backward",
    "add_scalar",
    "log",
    "update",
    "append",
    "extend",
    "copy_",
}


def is_host_method(name: str) -> bool:
    return name in HOST_METHODS or is_tensor_metadata_method(name)


# a module's methods that move, convert or configure it: they compute nothing per step
MODULE_UPKEEP = {"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "requires_grad_", "apply", "load_state_dict"}
MODULE_UPKEEP |= {"share_memory", "get_submodule", "get_parameter", "add_module", "extra_repr", "fit", "no_sync", "join"}
MODULE_UPKEEP |= {"step", "copy_to", "store", "restore"}  # an EMA copy of the model, updated after the optimizer
# methods of strings, lists and dicts: a value taken for a model by its name (`d`, `g`) is no model then
MODULE_UPKEEP |= {"startswith", "endswith", "split", "join", "replace", "format", "strip", "lower", "upper", "get", "pop"}
MODULE_UPKEEP |= {"insert", "remove", "clear", "copy", "setdefault", "index", "count", "sort", "add", "discard"}
_UPKEEP_PREFIXES = ("register_", "named_", "load_", "save_", "set_", "init_", "reset_", "update_")


def computes_per_step(method: str) -> bool:
    """Whether a model's method `model.<method>(...)` runs the model (`encode`, `log_probs`, a submodule's
    forward), rather than moving, converting, configuring or reading it."""
    return not (is_host_method(method) or method in MODULE_UPKEEP or method.startswith(_UPKEEP_PREFIXES))


# the host's clocks: reading one changes nothing (a step timed after the replay measures the replay)
HOST_CLOCKS = {"time.time", "time.perf_counter", "time.monotonic", "time.process_time", "time.time_ns", "time.perf_counter_ns"}
HOST_CLOCKS |= {"datetime.datetime.now", "datetime.datetime.utcnow", "timeit.default_timer"}
# Roots of configuration objects (argparse namespaces, configs): their attributes are host values.
CONFIG_ROOTS = {"args", "opt", "opts", "config", "cfg", "conf", "hparams", "hp", "FLAGS", "flags", "settings", "options"}

# torch.* callables that do not return a tensor on the device.
_TORCH_NON_TENSOR = re.compile(
    r"^torch\.(cuda|distributed|optim|utils|backends|jit|onnx|compiler|_dynamo|profiler|autograd\.profiler|"
    r"nn\.(?!functional)|amp|cpu|mps|hub|testing|fx|export|package|multiprocessing|library)(\.|$)"
    r"|^torch\.(device|dtype|no_grad|enable_grad|inference_mode|set_grad_enabled|is_tensor|is_grad_enabled|"
    r"manual_seed|seed|initial_seed|get_rng_state|set_rng_state|save|load|compile|autocast|Generator|"
    r"set_printoptions|set_float32_matmul_precision|use_deterministic_algorithms|set_default_dtype|"
    r"get_default_dtype|numel|is_floating_point|is_complex|set_num_threads|get_num_threads|"
    r"float\d*|int\d*|bfloat16|half|long|bool|double|Size|finfo|iinfo)$"
)


def is_torch_tensor_call(qual: str | None) -> bool:
    return bool(qual) and qual.startswith("torch.") and not _TORCH_NON_TENSOR.match(qual)


def is_noise_scheduler_class(qual: str) -> bool:
    """diffusers' `DDPMScheduler(...)`, `DDIMScheduler.from_pretrained(...)`: diffusion noise schedules."""
    return qual.startswith("diffusers.") and any(part.endswith("Scheduler") for part in qual.split("."))


def kind_by_name(name: str) -> str | None:
    for pattern, kind in (
        (_SCHEDULER_NAME, SCHEDULER),
        (_SCALER_NAME, SCALER),
        (_OPTIMIZER_NAME, OPTIMIZER),
        (_LOADER_NAME, LOADER),
        (LOSS_NAME, LOSS),
        (_ENV_NAME, ENV),
        (_MODEL_NAME, MODEL),
    ):
        if pattern.match(name):
            return kind
    return None


# Builtins that read their arguments and change nothing: a statement calling only these has no effect
# beyond the names it binds.
PURE_BUILTINS = frozenset(
    {
        "len", "isinstance", "hasattr", "getattr", "type", "min", "max", "abs", "int", "float", "bool", "str",
        "round", "any", "all", "format", "repr", "sum", "range", "enumerate", "zip", "list", "tuple", "dict",
        "set", "sorted", "reversed",
    }
)  # fmt: skip
