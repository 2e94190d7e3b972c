"""Study (docs/RESULTS.md, "dLLM"): build a tiny base through the cache (`ensure_built`, the `mmrl pretrain-tiny`
path) with a validation learning curve, then print its held-out (test) accuracy once.

    python scripts/studies/build_with_curve.py countdown3-md 150 [--force]

The curve: greedy accuracy on the first 256 validation rows every EVERY steps (d1's decoding, steps = length).
Build time is reported without the curve's evaluations (wall and CPU seconds).
"""
import json
import sys
import time

import torch

torch.set_num_threads(1)

from mmrl.data.tasks import load_task  # noqa: E402
from mmrl.tiny_world import register  # noqa: E402
from mmrl.tiny_world.models import ensure_built, held_out_accuracy, spec_for  # noqa: E402
from mmrl.training.evaluate import d1_generation, evaluate  # noqa: E402

register()
name, every = sys.argv[1], int(sys.argv[2])
spec = spec_for(name)
task = load_task(spec.task)
rows = task.validation[:256]
spent = {"wall": 0.0, "cpu": 0.0}


def curve(policy):
    gen = d1_generation(spec.family, spec.gen_length, spec.gen_length, spec.gen_length)

    def fn():
        w, c = time.perf_counter(), time.process_time()
        acc = evaluate(policy, rows, task.metric, batch_size=128, progress=False, **gen).accuracy
        spent["wall"] += time.perf_counter() - w
        spent["cpu"] += time.process_time() - c
        print(json.dumps({"name": name, "eval_seconds_so_far": round(spent["wall"], 1), "validation_acc": acc}), flush=True)
        return acc

    return fn


path = ensure_built(name, force="--force" in sys.argv, progress=False, curve=curve, curve_every=every)
info = json.loads((path / "tiny_spec.json").read_text())
out = {"name": name, "path": str(path), "build_wall_s": round(info["seconds"] - spent["wall"], 1),
       "build_cpu_s": round(info.get("cpu_seconds", float("nan")) - spent["cpu"], 1), "curve": info.get("curve"),
       "recipe": spec.recipe, "steps": spec.steps}
print(json.dumps(out), flush=True)
print(json.dumps({"name": name, "test": held_out_accuracy(name)}), flush=True)
