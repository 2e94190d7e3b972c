"""Study (docs/RESULTS.md, "Sudoku base variants tried" and "The Sudoku base re-examined"): pre-train a sudoku4
base variant and score it on the validation puzzles (every choice on validation; the test split is not read).

    python scripts/studies/pretrain_variant.py SAVE_DIR STEPS MIN_BLANKS MAX_BLANKS [LR] [KEY=VALUE ...]

SAVE_DIR: where the weights go ("-" keeps none). KEY=VALUE options:
- `family=causal_lm`: the same puzzles posed to the causal LM of the same size (`countdown3-ar`'s Qwen2 class, 4
  layers x 128): the puzzle in the prompt, the 16-cell solution as the target (`tasks.sudoku4_causal_row`), the
  same reward; greedy decoding;
- any masked-diffusion recipe key of `TinySpec.recipe`, e.g. `token_reweight=[0.25,2]` (MGDM's token reweighting,
  Ye et al., ICLR 2025, arXiv 2410.14157);
- `seed=N`: the initialisation and data-order seed (default 0, the shipped base's);
- `out=FILE.jsonl`: append the record (options, build CPU seconds, weights digest, per-puzzle scores per decoding);
- `split=test`: the first 256 test puzzles instead, the rows behind the "variants tried" figures written before the
  validation split existed (reproduction only, never a choice).

Masked-diffusion decodings (greedy): `low_confidence` (LLaDA's, one token per step over the 16-cell span, the
shipped evaluation) and `easy_first` (MGDM's easy-first top-k with re-masking, `sampler="easy_first"`).
Prints one line: build seconds, final loss, cell accuracy (mean over puzzles of the share of blanks right) and
solve rate (share of puzzles with every blank right) per decoding.
"""
import ast
import dataclasses
import json
import logging
import os
import sys
import time

import torch

torch.set_num_threads(int(os.environ.get("THREADS", "1")))

from mmrl.data.tasks import load_task  # noqa: E402
from mmrl.tiny_world import register as register_tiny_world  # noqa: E402
from mmrl.tiny_world.models import TINY_MODELS, pretrain, weights_digest  # noqa: E402
from mmrl.tiny_world.tasks import sudoku4_causal_row  # noqa: E402
from mmrl.training.evaluate import d1_generation, evaluate  # noqa: E402

logger = logging.getLogger("pretrain_variant")
EVAL_ROWS = 256
"""Puzzles scored: the whole validation split (256 puzzles of its 29 grids); with `split=test`, the first 256."""
DECODES = {
    "masked_diffusion": {
        "low_confidence": dict(gen_length=16, block_length=16, steps=16, sampler="low_confidence", temperature=0.0),
        "easy_first": dict(gen_length=16, block_length=None, steps=16, sampler="easy_first", temperature=0.0),
    },
    "causal_lm": {"greedy": d1_generation("causal_lm", 16, 16, 16)},
}
"""Greedy decodings per family (16 cells; the masked-diffusion canvas starts from the puzzle's given cells)."""


def eval_rows(family: str, split: str) -> list[dict]:
    """The scored puzzles, posed to `family` (the infilling rows, or the same puzzles as causal prompts)."""
    task = load_task("sudoku4")
    if split not in ("validation", "test"):
        raise ValueError(f"split must be 'validation' or 'test', got {split!r}")
    rows = (task.validation if split == "validation" else task.test)[:EVAL_ROWS]
    return [sudoku4_causal_row(r["puzzle"], r["solution"]) for r in rows] if family == "causal_lm" else rows


def tokens_per_row(policy, spec) -> int:
    """Positions one training row feeds the model (the padded width of the pre-training batches): masked
    diffusion, the longest prompt + the 16-cell span; causal, the longest prompt + solution + EOS."""
    from mmrl.tiny_world.models import _training_pairs

    prompts, targets = _training_pairs(spec)
    tok = policy.tokenizer
    if spec.family == "masked_diffusion":
        return max(len(tok(policy._prompt_text(p), add_special_tokens=False)["input_ids"]) for p in prompts[:512]) + spec.gen_length
    return max(len(tok(p)["input_ids"]) + len(tok(t)["input_ids"]) + 1 for p, t in zip(prompts[:512], targets[:512]))


def run(steps: int, lo: int, hi: int, lr: float = 2e-3, family: str = "masked_diffusion", recipe: dict | None = None,
        split: str = "validation", save: str | None = None, seed: int = 0) -> dict:
    """Pre-train the variant (the `sudoku4` spec with these steps, blank range, lr, family and recipe; one torch
    thread) and score it; returns the record (per-puzzle scores under every decoding of the family)."""
    register_tiny_world()  # the tiny world's tasks and rewards (the engine does not import it)
    if family not in DECODES:
        raise ValueError(f"family must be one of {sorted(DECODES)}, got {family!r}")
    base = TINY_MODELS["sudoku4"]
    arch = {k: v for k, v in base.arch.items()}
    spec = dataclasses.replace(base, family=family, steps=int(steps), pretrain_filter={"blanks": [int(lo), int(hi)]},
                               lr=float(lr), recipe=dict(recipe or {}), arch=arch, seed=int(seed))
    c0, t0 = time.process_time(), time.perf_counter()
    pol, hist = pretrain(spec, progress=False)
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    digest = None
    if save:
        pol.save_pretrained(save)
        digest = weights_digest(save)[:12]
    rows = eval_rows(family, split)
    task = load_task("sudoku4")
    decodes = {}
    for name, gen in DECODES[family].items():
        r = evaluate(pol, rows, task.metric, batch_size=128, progress=False, **gen)
        decodes[name] = {"cell_acc": r.accuracy, "solved": sum(s == 1.0 for s in r.scores) / len(r.scores),
                         "scores": r.scores, "completions": r.completions[:8]}
    n_params = sum(p.numel() for p in pol.model.parameters())
    return {"opts": {"steps": int(steps), "blanks": [int(lo), int(hi)], "lr": float(lr), "family": family,
                     "recipe": dict(recipe or {}), "split": split, "batch_size": spec.batch_size, "seed": int(seed)},
            "build_cpu_s": round(cpu, 1), "build_wall_s": round(wall, 1), "final_loss": hist[-1]["loss"],
            "weights_sha256_12": digest, "parameters": n_params, "tokens_per_row": tokens_per_row(pol, spec),
            "puzzles": [r["puzzle"] for r in rows], "decodes": decodes}


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pos = [a for a in argv if "=" not in a]
    kv = dict(a.split("=", 1) for a in argv if "=" in a)
    if len(pos) not in (4, 5):
        raise SystemExit(__doc__)
    save, steps, lo, hi = pos[0], int(pos[1]), int(pos[2]), int(pos[3])
    lr = float(pos[4]) if len(pos) > 4 else 2e-3
    family = kv.pop("family", "masked_diffusion")
    split = kv.pop("split", "validation")
    out = kv.pop("out", None)
    seed = int(kv.pop("seed", 0))
    recipe = {k: ast.literal_eval(v) if v[:1].isdigit() or v[:1] in "-[." else v for k, v in kv.items()}
    rec = run(steps, lo, hi, lr, family, recipe, split, None if save == "-" else save, seed)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(rec) + "\n")
    scores = ", ".join(f"{k} cell {v['cell_acc']:.3f} solved {v['solved']:.3f}" for k, v in rec["decodes"].items())
    logger.info("%s %s train cpu s %.0f loss %.3f %s %s", save, family, rec["build_cpu_s"], rec["final_loss"], split, scores)


if __name__ == "__main__":
    main(sys.argv[1:])
