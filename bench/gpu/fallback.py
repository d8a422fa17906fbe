"""A step the runtime leaves eager must cost what eager costs: side by side in one process, the same
launch-bound training step run plainly, through a CapturedStep that fell back to eager (a host value
moves every step, so warmup's host-value check gives up), and captured (the value held still).

    python bench/gpu/fallback.py [--json bench/results/gpu_fallback.json]

Each variant is timed over 300 steps after 30 (warmup, the check, the capture), five times alternating;
the median is reported, and the fallen-back step's ratio to eager.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch

from graphify.runtime import CapturedStep


class _Schedule:
    t = 0

    @property
    def weight(self):  # read through a property: only the runtime's check sees it move
        return 1.0 + self.t / 1000


def _build(amp: bool):
    torch.manual_seed(0)
    layers = []
    for _ in range(12):
        layers += [torch.nn.Linear(256, 256), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 1)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # built non-capturable, as most scripts do
    schedule = _Schedule()

    def train_step(x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
            loss = torch.nn.functional.mse_loss(model(x).float(), y) * schedule.weight
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    return train_step, schedule


def _ms_per_step(wrap, amp: bool, moving: int) -> float:
    step, schedule = _build(amp)
    step = wrap(step)
    x, y = torch.randn(64, 256, device="cuda"), torch.randn(64, 1, device="cuda")
    for _ in range(30):
        schedule.t += moving
        step(x, y)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(300):
        schedule.t += moving
        step(x, y)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / 300 * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="bench/results/gpu_fallback.json")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    rows = []
    for amp in (False, True):
        runs = {"eager": [], "fallen back": [], "captured": []}
        for _ in range(args.repeat):
            runs["eager"].append(_ms_per_step(lambda f: f, amp, 1))
            runs["fallen back"].append(_ms_per_step(CapturedStep, amp, 1))
            runs["captured"].append(_ms_per_step(CapturedStep, amp, 0))
        ms = {k: statistics.median(v) for k, v in runs.items()}
        rows.append({"amp": amp, "ms_per_step": ms, "runs": runs, "fallen_back_vs_eager": ms["fallen back"] / ms["eager"]})
        print(
            f"bf16 autocast {'on ' if amp else 'off'}: eager {ms['eager']:.3f} ms, fallen back {ms['fallen back']:.3f} ms "
            f"({rows[-1]['fallen_back_vs_eager']:.2f}x eager), captured {ms['captured']:.3f} ms"
        )
    device = f"{torch.cuda.get_device_name()}, torch {torch.__version__}"
    with open(args.json, "w") as out:
        json.dump({"device": device, "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
