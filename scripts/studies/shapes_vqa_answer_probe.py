"""Diagnostic (docs/RESULTS.md, "Issue 25, item 5"): where does a position question's answer get lost in the text
model? For a shapes_vqa base (`--base`), the hidden state at the last prompt token (the one that predicts the answer's
first token) is taken after the embeddings and after each text layer, for position questions ("red circle left or
right of blue square?"); a linear classifier per layer (softmax regression on standardised states, Adam) is fitted on
TRAIN_ROWS training questions and scored on every position question of the validation scenes (all ordered pairs, not
only the task's one per scene) for three targets: the answer (left / right, chance about 1/2), the first-named
object's column and the second-named object's column (cells 0 .. 9). If the columns are readable at some layer and the
answer is not, the text model finds both objects but does not compare them; if not even the columns are, it does not
find them. A base pre-trained with a column question (`aux_types`) gets a control: the same read-out of that question's
own answer, which the base does give (validation column questions). Validation scenes only for the scores; nothing is
written.

    OMP_NUM_THREADS=1 python scripts/studies/shapes_vqa_answer_probe.py --base shapes-vqa-qwen3-col50
"""
import argparse

import torch

from mmrl.tiny_world import register
from mmrl.tiny_world.models import load_base_policy, spec_for
from mmrl.tiny_world.read_out import linear_read_out
from mmrl.tiny_world.shapes import GRID, PATTERN
from mmrl.tiny_world.shapes_vqa import CELL_PX, auxiliary_rows, scene_questions, split_scenes
from mmrl.tiny_world.vqa_rl import vqa_base_option

TRAIN_ROWS = 1500
FIT_STEPS = 2000

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--base", default="shapes-vqa-qwen3-col50", type=vqa_base_option)
args = parser.parse_args()
torch.set_num_threads(1)
torch.manual_seed(0)
register()
policy = load_base_policy(args.base, progress=False)
policy_spec = spec_for(args.base)
scenes = split_scenes()


def position_rows(split: str, limit: int | None = None) -> list[dict]:
    """Every position question of every scene of `split`, with the two named objects' columns."""
    out = []
    for scene in scenes[split]:
        by_name = {f"{o.color} {o.shape}": o for o in scene.objects}
        for q, a in scene_questions(scene)["position"]:
            first, second = q.removesuffix("?").split(" left or right of ")
            out.append({"prompt": {"prompt": q, "images": [scene.render(CELL_PX)]}, "answer": int(a == "right"),
                        "first": by_name[first].col, "second": by_name[second].col})
            if limit is not None and len(out) == limit:
                return out
    return out


@torch.no_grad()
def last_states(rows: list[dict]) -> torch.Tensor:
    """[layers + 1, n, H] hidden state at the last prompt token, after the embeddings and after each text layer."""
    out = []
    for r in rows:
        ids, extras = policy.encode_prompts([r["prompt"]])[:2]
        ids = torch.tensor(ids)  # [1, L]
        mask = torch.ones_like(ids)
        hidden = policy.model(input_ids=ids, attention_mask=mask, output_hidden_states=True,
                              **policy._forward_inputs(ids, mask, extras)).hidden_states
        out.append(torch.stack([h[0, -1] for h in hidden]))  # [layers + 1, H]
    return torch.stack(out, 1).float()


def read_out(x_tr: torch.Tensor, y_tr: torch.Tensor, x_va: torch.Tensor, y_va: torch.Tensor, classes: int) -> tuple[float, float]:
    """(training, validation) accuracy of a linear classifier of y from x."""
    fit, predicted = linear_read_out(x_tr, y_tr, x_va, classes, steps=FIT_STEPS, weight_decay=1e-3)
    return fit, float(predicted.eq(y_va).float().mean())


train, val = position_rows("train", TRAIN_ROWS), position_rows("validation")
h_tr, h_va = last_states(train), last_states(val)
columns = GRID - PATTERN + 1
print(f"{args.base}: position questions, {len(train)} training / {len(val)} validation (every ordered pair of the "
      f"validation scenes); linear read-out of the last prompt token's state, training / validation accuracy")


def report(label: str, h_tr: torch.Tensor, y_tr: torch.Tensor, h_va: torch.Tensor, y_va: torch.Tensor, classes: int) -> None:
    base = float(y_va.eq(torch.bincount(y_tr, minlength=classes).argmax()).float().mean())
    cells = [read_out(h_tr[k], y_tr, h_va[k], y_va, classes) for k in range(h_tr.shape[0])]
    print(f"  {label:14s} (majority {base:.3f}): " + "  ".join(
        f"{'emb' if k == 0 else f'L{k}'} {fit:.3f}/{hit:.3f}" for k, (fit, hit) in enumerate(cells)))


for target, classes in (("answer", 2), ("first", columns), ("second", columns)):
    report(target, h_tr, torch.tensor([r[target] for r in train]), h_va, torch.tensor([r[target] for r in val]), classes)
if aux := list(policy_spec.data.get("aux_types", [])):  # the control: a question the base does answer from the column
    c_tr, c_va = auxiliary_rows(aux[0], "train")[:TRAIN_ROWS], auxiliary_rows(aux[0], "validation")
    print(f"control, the base's own {aux[0]} question ({len(c_tr)} training / {len(c_va)} validation), its answer:")
    report(aux[0], last_states(c_tr), torch.tensor([int(r["answer"]) for r in c_tr]), last_states(c_va),
           torch.tensor([int(r["answer"]) for r in c_va]), columns)
