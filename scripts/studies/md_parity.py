"""Study (docs/RESULTS.md, "dLLM"): the masked-diffusion Countdown base at equal pre-training compute (issue 24).

One variant of the `countdown3-md` recipe: a causal phase of CAUSAL steps (cached in `$MMRL_CACHE/studies/`, so
variants of the diffusion phase share it), then DIFF masked-diffusion steps with the recipe keys given; prints a
JSON line per evaluation (pre-training steps so far = CAUSAL + diffusion step, validation greedy accuracy on the
first 256 validation rows, low-confidence order one token per step) and, at the end, the accuracy under other
decodings. Build CPU seconds exclude the evaluations. Every choice is made on validation.

    python scripts/studies/md_parity.py OUT.jsonl causal=600 diff=600 token_reweight=[0.25,2] diffusion_lr=5e-4 \
        suffix_frac=0.5 anneal_steps=150 pad_loss=False time_weight=none normalise=masked eval_every=150 seed=0

`pad_loss=False` leaves the post-EOS padding out of the loss (`masked_sft_loss`); `seed` seeds both phases (each
CAUSAL and seed has its own cached causal phase).
"""
import ast
import dataclasses
import json
import sys
import time

import torch

torch.set_num_threads(1)

from mmrl.data.tasks import load_task  # noqa: E402
from mmrl.models.masked_diffusion import MaskedDiffusionAdapter  # noqa: E402
from mmrl.tiny_world import pretrain as pt  # noqa: E402
from mmrl.tiny_world import register  # noqa: E402
from mmrl.tiny_world.models import _training_pairs, build_untrained, cache_root, spec_for  # noqa: E402
from mmrl.training.evaluate import evaluate  # noqa: E402

register()
out = sys.argv[1]
o = dict(causal=600, diff=600, lr=2e-3, eval_every=150, time_weight="none", normalise="masked", seed=0)
for a in sys.argv[2:]:
    k, v = a.split("=", 1)
    o[k] = ast.literal_eval(v) if v[0].isdigit() or v[0] in "-[." or v in ("True", "False") else v
spec = dataclasses.replace(spec_for("countdown3-md"), seed=o["seed"])
prompts, targets = _training_pairs(spec)
task = load_task("countdown3")
rows = task.validation[:256]
DECODES = {"lowconf": dict(block_length=16, steps=16, sampler="low_confidence"),
           "l2r": dict(block_length=1, steps=16, sampler="low_confidence"),
           "easy_first": dict(block_length=None, steps=16, sampler="easy_first")}


def val(policy, decode="lowconf"):
    return evaluate(policy, rows, task.metric, batch_size=128, progress=False, gen_length=16, temperature=0.0,
                    **DECODES[decode]).accuracy


ckpt = cache_root().parent / "studies" / f"md-causal-{o['causal']}-lr{o['lr']}-seed{o['seed']}"
if (ckpt / "causal_cpu_s.json").is_file():
    policy = MaskedDiffusionAdapter.from_pretrained(ckpt)
    causal_cpu = json.loads((ckpt / "causal_cpu_s.json").read_text())["cpu_s"]
else:
    policy = build_untrained(spec)
    c0 = time.process_time()
    if o["causal"]:
        pt.causal_phase(policy, [policy._prompt_text(p) for p in prompts], targets, steps=o["causal"],
                        batch_size=spec.batch_size, lr=o["lr"], seed=o["seed"])
    causal_cpu = time.process_time() - c0
    policy.save_pretrained(ckpt)
    (ckpt / "causal_cpu_s.json").write_text(json.dumps({"cpu_s": causal_cpu}))
log = open(out, "a")


def causal_val(policy):
    """The causal phase's own accuracy: causal attention, left-to-right greedy (with shifted logits and causal
    attention the masks to the right are invisible, so this is the causal LM's greedy decoding)."""
    from mmrl.models.dllm_backbone import base_model

    cfg = base_model(policy.model).config
    cfg.is_causal = True
    try:
        return val(policy, "l2r")
    finally:
        cfg.is_causal = False


phase0 = {"causal_phase_val_acc": causal_val(policy), "bidirectional_val_acc_before_diffusion": val(policy)}


def emit(rec):
    rec = {"opts": o, **rec}
    print(json.dumps(rec), flush=True)
    log.write(json.dumps(rec) + "\n")


spent = [0.0]


def eval_fn():
    c = time.process_time()
    acc = val(policy)
    spent[0] += time.process_time() - c
    return acc


recipe = {k: o[k] for k in ("time_weight", "normalise", "token_reweight", "diffusion_lr", "suffix_frac", "anneal_steps", "pad_loss") if k in o}
c0 = time.process_time()
hist = pt.masked_diffusion_sft(policy, prompts, targets, gen_length=spec.gen_length, steps=o["diff"], batch_size=spec.batch_size,
                               lr=o["lr"], seed=o["seed"], eval_fn=eval_fn, eval_every=o["eval_every"], progress=False, **recipe)
diff_cpu = time.process_time() - c0 - spent[0]
for h in hist:
    if "eval" in h:
        emit({"step": o["causal"] + h["step"], "val_acc": h["eval"]})
final = {d: val(policy, d) for d in DECODES}
emit({"final": final, **phase0, "causal_cpu_s": round(causal_cpu, 1), "diffusion_cpu_s": round(diff_cpu, 1),
      "build_cpu_s": round(causal_cpu + diff_cpu, 1), "final_loss": hist[-1]["loss"]})
