"""Study (docs/RESULTS.md, "dLLM"): why the tiny masked-diffusion Countdown base ignores its prompt.

Pre-trains the `countdown3` masked-diffusion model with one recipe variant and prints a JSON line per evaluation:
step, training tokens fed, seconds, validation greedy accuracy (first 256 countdown3 validation rows, low-confidence
decoding, one token per step) and the prompt-reading probe (all-masked response CE with the true prompt vs with
another row's prompt: equal means the model ignores its prompt).

    python scripts/studies/mdm_countdown.py OUT.jsonl steps=600 time_weight=inv_t norm=length focal=0 lr=2e-3
"""
import ast
import json
import sys
import time

import torch

torch.set_num_threads(1)

from mmrl.data.tasks import load_task  # noqa: E402
from mmrl.tiny_world import register  # noqa: E402
from mmrl.tiny_world.models import TINY_MODELS, build_untrained, _training_pairs  # noqa: E402
from mmrl.tiny_world import pretrain as pt  # noqa: E402
from mmrl.training.evaluate import evaluate  # noqa: E402

register()
out = sys.argv[1]
o = dict(steps=600, lr=2e-3, batch=64, time_weight="inv_t", norm="length", focal=0.0, eval_every=100, hidden=128,
         layers=4, seed=0, sampler="low_confidence", warmup=0.05, gen_length=16)
o.update({k: ast.literal_eval(v) if v[0].isdigit() or v[0] in "-[" else v for k, v in (a.split("=", 1) for a in sys.argv[2:])})
import dataclasses  # noqa: E402

spec = dataclasses.replace(TINY_MODELS["countdown3"], steps=o["steps"], lr=o["lr"], batch_size=o["batch"], seed=o["seed"],
                           gen_length=o["gen_length"],
                           arch=dict(hidden_size=o["hidden"], intermediate_size=2 * o["hidden"], num_hidden_layers=o["layers"],
                                     num_attention_heads=4, num_key_value_heads=4))
if o.get("shift"):
    from mmrl.models.masked_diffusion import MaskedDiffusionAdapter

    policy = MaskedDiffusionAdapter.tiny(seed=spec.seed, gen_length=o["gen_length"], block_length=o["gen_length"], steps=o["gen_length"], shift_logits=True, **spec.arch)
else:
    policy = build_untrained(spec)
prompts, targets = _training_pairs(spec)
task = load_task("countdown3")
rows = task.validation[:256]  # every choice on validation
gl = o["gen_length"]
tok = policy.tokenizer
ep, em, er = pt.pack_pairs(tok, [r["prompt"] for r in rows], [r["solution"] for r in rows], gl, policy.pad_token_id, policy.eos_token_ids[0])


def probe():
    """All-masked response CE (nats/token over the target incl. first EOS) with the true vs a rolled prompt."""
    import torch.nn.functional as F

    noisy = torch.full_like(er, policy.mask_token_id)
    valid = torch.ones_like(er, dtype=torch.bool)
    res = []
    for shift in (0, 1):
        pi, pm = torch.roll(ep, shift, 0), torch.roll(em, shift, 0)
        with torch.no_grad():
            lg = policy.backbone_logits(pm, gl, policy.model)(torch.cat([pi, noisy], 1))[:, -gl:]
        ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), er.reshape(-1), reduction="none").view(er.shape)
        res.append(float((ce * valid).sum() / valid.sum()))
    return res


def ev():
    gen = dict(gen_length=gl, block_length=gl, steps=gl, temperature=0.0, sampler=o["sampler"])
    r = evaluate(policy, rows, task.metric, batch_size=128, progress=False, **gen)
    return r.accuracy, r.completions[:4]


# the loss variant, monkey-patched into the SFT loop's loss so the loop (optimizer, schedule, data order) is the spec's
import torch.nn.functional as F  # noqa: E402


def loss_fn(policy, x_p, m_p, x_r, fixed, generator, *, eps=1e-3):
    b, t_len = x_r.shape
    t = eps + (1 - eps) * torch.rand(b, 1, generator=generator)
    masked = (torch.rand(b, t_len, generator=generator) < t) & ~fixed
    if o.get("suffix"):  # a share of rows masks a random suffix (block-autoregressive conditionals)
        cut = torch.randint(0, t_len, (b, 1), generator=generator)
        suf = torch.arange(t_len)[None] >= cut
        pick = torch.rand(b, 1, generator=generator) < o["suffix"]
        masked = torch.where(pick, suf & ~fixed, masked)
        t = torch.where(pick, suf.float().mean(-1, keepdim=True).clamp(min=eps), t)
    noisy = torch.where(masked, torch.full_like(x_r, policy.mask_token_id), x_r)
    logits = policy.backbone_logits(m_p, t_len, policy.model)(torch.cat([x_p, noisy], dim=1))[:, -t_len:]
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x_r.reshape(-1), reduction="none").view(b, t_len)
    if o["focal"]:
        ce = o["focal"] * (1 - torch.exp(-ce.detach() if o.get("focal_detach") else -ce)) ** 2 * ce
    w = {"inv_t": 1 / t, "linear": 1 - t + eps, "none": torch.ones_like(t)}[o["time_weight"]]
    num = (ce * masked * w).sum()
    den = masked.sum().clamp(min=1) if o["norm"] == "masked" else (b * t_len - fixed.sum()).clamp(min=1)
    return num / den


pt.masked_sft_loss = loss_fn
tokens_per_step = o["batch"] * (ep.shape[1] + gl)
t0 = time.perf_counter()
log = open(out, "a")


def eval_fn():
    acc, comp = ev()
    p = probe()
    return acc, comp, p


# run in chunks so evaluation time is not counted as training time
hist_all = []
done = 0
opt_state = None
# simplest: one SFT call with eval_fn; the loop passes float(eval_fn()) so we log from inside
records = []


def cb():
    acc, comp, p = eval_fn()
    records.append({"acc": acc, "comp": comp, "probe_true": p[0], "probe_rolled": p[1], "cpu_s": round(time.process_time(), 1)})
    return acc


if o.get("ar_init"):  # Dream / DiffuLLaMA-style: causal next-token pre-training first, then masked diffusion
    from types import SimpleNamespace
    from mmrl.models.dllm_backbone import base_model

    cfg = base_model(policy.model).config
    cfg.is_causal = True
    shim = SimpleNamespace(model=policy.model, tokenizer=tok,
                           generation_defaults={"eos_token_id": [policy.eos_token_ids[0]], "pad_token_id": policy.pad_token_id})
    ah = pt.causal_sft(shim, [policy._prompt_text(x) for x in prompts], targets, steps=o["ar_init"], batch_size=o["batch"],
                       lr=o["lr"], seed=o["seed"], progress=False)
    cfg.is_causal = False
    print(json.dumps({"ar_init_steps": o["ar_init"], "ar_loss": ah[-1]["loss"], "seconds": ah[-1]["seconds"], "cpu_s": round(time.process_time(), 1), "acc_after_ar": ev()[0]}), flush=True)
if o.get("causal_only"):  # the causal reference curve on the same model class (no masked-diffusion phase)
    from types import SimpleNamespace
    from mmrl.models.dllm_backbone import base_model
    from mmrl.models.causal_lm import CausalLMAdapter

    cp = CausalLMAdapter.tiny(seed=spec.seed, max_new_tokens=gl, **spec.arch)

    def cev():
        r = evaluate(cp, rows, task.metric, batch_size=128, progress=False, temperature=1.0, top_k=1, max_new_tokens=gl)
        return r.accuracy

    ch = pt.causal_sft(cp, prompts, targets, steps=o["steps"], batch_size=o["batch"], lr=o["lr"], seed=o["seed"],
                       eval_fn=cev, eval_every=o["eval_every"], progress=False)
    for h in ch:
        if "eval" in h:
            rec = {"opts": o, "family": "causal_lm", "step": h["step"], "seconds": round(h["seconds"], 1), "acc": h["eval"]}
            print(json.dumps(rec), flush=True)
            log.write(json.dumps(rec) + "\n")
    sys.exit(0)
hist = pt.masked_diffusion_sft(policy, prompts, targets, gen_length=gl, steps=o["steps"], batch_size=o["batch"], lr=o["lr"],
                               seed=o["seed"], eval_fn=cb, eval_every=o["eval_every"], progress=False)
k = 0
for h in hist:
    if "eval" in h:
        r = records[k]
        k += 1
        rec = {"opts": o, "step": h["step"], "train_tokens": h["step"] * tokens_per_step, "seconds": round(h["seconds"], 1),
               "loss": round(sum(x["loss"] for x in hist[max(0, h["step"] - 20):h["step"]]) / min(20, h["step"]), 4), **r}
        print(json.dumps(rec), flush=True)
        log.write(json.dumps(rec) + "\n")
if o.get("save"):
    policy.save_pretrained(o["save"])
for bl in o.get("final_blocks", []):  # the final model under semi-autoregressive decoding (block_length bl)
    gen = dict(gen_length=gl, block_length=bl, steps=gl, temperature=0.0, sampler=o["sampler"])
    r = evaluate(policy, rows, task.metric, batch_size=128, progress=False, **gen)
    rec = {"opts": o, "final_block_length": bl, "acc": r.accuracy, "comp": r.completions[:4]}
    print(json.dumps(rec), flush=True)
    log.write(json.dumps(rec) + "\n")
