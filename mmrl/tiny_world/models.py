"""The tiny base models: built with mmrl's adapters on real transformers classes, pre-trained by mmrl's own code
to partial competence, deterministic for a seed, and cached in a user cache directory.

    from mmrl.tiny_world.models import load_base_policy
    policy = load_base_policy("sudoku4")          # builds it on first use (about a minute on 2 cores), then cached

or from the command line `mmrl pretrain-tiny sudoku4`. The cache lives in `$MMRL_CACHE` (default
`~/.cache/mmrl`), under `tiny_world/<name>-<hash of the spec>/`, written atomically (a temporary directory then a
rename), so an interrupted build never leaves a half model behind.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from mmrl.checkpointing.checkpoint import verify_checkpoint, write_manifest
from mmrl.checkpointing.optimizer_state import OPTIMIZER_FILE, save_adamw_state
from mmrl.tiny_world.shapes_vqa import QUESTION_TYPES as VQA_QUESTION_TYPES

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TinySpec:
    """How one tiny base model is built."""

    name: str
    """Registry name (also the default task)."""
    family: str
    """Adapter family."""
    task: str
    """Task whose training split it is pre-trained on."""
    arch: dict
    """Model size overrides passed to the adapter's `tiny()`."""
    steps: int
    """Optimizer steps of supervised pre-training."""
    lr: float = 2e-3
    """Pre-training learning rate (AdamW, warm-up then linear decay)."""
    batch_size: int = 64
    """Pre-training batch size."""
    seed: int = 0
    """Initialisation and data-order seed."""
    gen_length: int = 16
    """Generated span / new tokens of the model's responses."""
    pretrain_filter: dict = field(default_factory=dict)
    """Restricts the pre-training rows (e.g. easier Sudoku puzzles: `{"blanks": [1, 5]}`)."""
    data: dict = field(default_factory=dict)
    """Pre-training data options (countdown3: `label_noise`, the fraction of rows whose target is a wrong expression;
    `lazy_frac`, the fraction whose target is a shortcut solver's `(a op b) op c` with `lazy_op` "+" (default) or "*",
    the numbers in the prompt's order;
    shapes: `caption_noise`, the fraction of scenes drawn for a wrong caption;
    `balance_tasks`, rows drawn uniformly over the GenEval tasks rather than over prompts)."""
    recipe: dict = field(default_factory=dict)
    """Pre-training loss options of the masked-diffusion family (`mmrl.tiny_world.pretrain.masked_diffusion_sft`):
    `ar_init_steps` (causal next-token steps on the same backbone before the masked-diffusion steps, the AR-to-
    diffusion adaptation of Dream / DiffuLLaMA; needs `shift_logits=True` in `arch`), `time_weight` ("inv_t", LLaDA's
    1/t, the default; "linear"; "none"), `normalise` ("length", LLaDA, the default; "masked": the mean over masked
    tokens), `token_reweight` ([alpha, gamma]: MGDM's token reweighting), `diffusion_lr` (the diffusion steps' learning
    rate, default `lr`), `suffix_frac` (the share of rows masking a random suffix); of the causal family
    (`mmrl.tiny_world.pretrain.causal_sft`): `trim_padding` (each batch cut to its longest row)."""
    description: str = ""
    """What the model is for and the competence it reaches."""

    def key(self) -> str:
        """Hash of what determines the weights (everything but the description; `data` and `recipe` only when set,
        so specs written before they existed keep their cache; the task's data version,
        `tiny_world.tasks.TASK_VERSIONS`)."""
        from mmrl.tiny_world.tasks import TASK_VERSIONS

        fields = {k: v for k, v in asdict(self).items() if k != "description" and not (k in ("data", "recipe") and not v)}
        version = TASK_VERSIONS.get(self.task, 1)
        if version > 1:  # a base pre-trained on an older split of its task is another model
            fields["task_version"] = version
        blob = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:10]


SHAPES_MASKED_ARCH = dict(hidden_size=128, num_hidden_layers=3, num_attention_heads=4, text_hidden_size=64, text_layers=2,
                          model_max_length=16, num_steps=8, init_std=0.08)
"""The tiny aMUSEd of `shapes-masked` and its clean-caption twin `shapes-masked-clean`."""

SUDOKU4_ARCH = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4)
"""The bidirectional Llama of the Sudoku bases (`sudoku4`, `sudoku4-mid`, `sudoku4-strong`): 4 layers, 128 wide, 0.6M parameters."""

SHAPES_VQA_ARCH = dict(min_pixels=48 * 48, max_pixels=48 * 48,
                       text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                                "mrope_section": [2, 3, 3]}),
                       vision_config=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=64,
                                          fullatt_block_indexes=[0, 1]))
"""The tiny Qwen2.5-VL of the shapes_vqa bases: text 2 layers x 64, vision 2 blocks x 64 on 4-pixel patches of 48 px
scenes (one patch per cell, 36 image tokens after the 2 x 2 merge)."""

SHAPES_VQA_WIDE_ARCH = dict(min_pixels=48 * 48, max_pixels=48 * 48,
                            text_config=dict(SHAPES_VQA_ARCH["text_config"], hidden_size=128, intermediate_size=256,
                                             num_attention_heads=8, num_key_value_heads=4),
                            vision_config=dict(SHAPES_VQA_ARCH["vision_config"], hidden_size=128, intermediate_size=256,
                                               out_hidden_size=128))
"""`SHAPES_VQA_ARCH` twice as wide (text and vision 128, 8 text heads so that the head size and its 3-D RoPE
sections stay those of the narrow model), 0.99M parameters instead of 0.26M."""

SHAPES_VQA_DEEP_ARCH = dict(min_pixels=48 * 48, max_pixels=48 * 48, text_config=SHAPES_VQA_ARCH["text_config"],
                            vision_config=dict(SHAPES_VQA_ARCH["vision_config"], depth=4, fullatt_block_indexes=[0, 1, 2, 3]))
"""`SHAPES_VQA_ARCH` with a vision tower twice as deep (4 full-attention blocks of 64): a shape is a 3 x 3 cell pattern
spread over four merged image tokens, which the vision blocks must relate."""

SHAPES_VQA_QWEN3_ARCH = dict(model_type="qwen3_vl", min_pixels=48 * 48, max_pixels=48 * 48,
                             text_config=dict(SHAPES_VQA_ARCH["text_config"], head_dim=16),
                             vision_config=dict(depth=4, hidden_size=64, intermediate_size=128, num_heads=4, out_hidden_size=64,
                                                num_position_embeddings=144, deepstack_visual_indexes=[1, 2]))
"""`SHAPES_VQA_DEEP_ARCH`'s sizes as a `Qwen3VLForConditionalGeneration`: learned absolute position embeddings for
the 12 x 12 patch grid (Qwen2.5-VL's vision positions are relative only, so its image features carry no column
and a left/right question cannot be read off them), the text model's 3-D RoPE sections interleaved (the width
positions get the 3rd and 6th of the 8 frequencies rather than the lowest three) and DeepStack features from
vision blocks 1 and 2 added to the text model's two layers, as Qwen3-VL does with three of its blocks."""

SHAPES_VQA_QWEN3_DEEP_ARCH = dict(SHAPES_VQA_QWEN3_ARCH, text_config=dict(SHAPES_VQA_QWEN3_ARCH["text_config"], num_hidden_layers=4))
"""`SHAPES_VQA_QWEN3_ARCH` with 4 text layers instead of 2: a position question ("red circle left or right of blue
square?") has the text model find two objects by colour and shape and compare their columns, one more hop than a
colour or shape question (docs/RESULTS.md, "Issue 25, item 5": probe m)."""

SHAPES_VQA_PHASES = [[["colour"], 200], [["shape"], 200], [["count"], 200], [["position"], 200]]
"""The per-type curriculum of `shapes-vqa-reads`: 200 steps on each question type alone, in order, before the mix."""


SHAPES_VQA_SHAPE_PHASES = [[["colour"], 200], [["shape"], 1000], [["count"], 400], [["position"], 400]]
"""`SHAPES_VQA_PHASES` with five times the shape steps and twice the count and position steps: in every earlier
variant shape stayed at chance after its 200 clean steps, and count and position need the shape first."""

SHAPES_VQA_SIDE_PHASES = [[["side_one"], 1000], [["side_one", "side"], 1000]]
"""The `-side50*` bases' curriculum: "side of the red one?" on one-object scenes, then beside the same question in
the task's scenes (1-4 objects), before the mix."""


def _vqa_reads_spec(name: str, arch: dict, description: str, phases: list = SHAPES_VQA_PHASES) -> TinySpec:
    """A `shapes-vqa-reads` variant (issue 25 item 5): the per-type curriculum `phases` on true labels, then 800
    steps of the mix with 30% wrong labels, batches of 32; the variants differ in `arch` and `phases`."""
    clean = sum(steps for _, steps in phases)
    return TinySpec(name=name, family="vlm", task="shapes_vqa", arch=arch, steps=clean + 800, lr=2e-3, batch_size=32,
                    gen_length=10, data={"label_noise": 0.3, "phases": phases, "clean_steps": clean},
                    description=description)


def _vqa_column_spec(name: str, steps: int, aux: str | tuple[str, ...], table_scale: float | None, description: str,
                     word_tokens: bool = False, every_types: Sequence[str] = (), table_init: str | None = None,
                     phases: Sequence = ()) -> TinySpec:
    """A column-question variant of `shapes-vqa-qwen3` (issue 25 item 5): its model and true-label mix for `steps`
    steps plus one pre-training-only question of type `aux` (or of each type of a tuple) per training scene, the vision position table's
    initialisation times `table_scale` (None: as built), the table initialised to `table_init` ("sincos":
    `image_positions.sincos_2d`; None: the model's random draw), with `word_tokens` one token per word instead of per
    character, with every question of the `every_types` the training scenes support added to the mix, and with
    `phases` a curriculum (`[[types, steps], ...]`, task or auxiliary types) before the mix; the variants differ in
    these seven."""
    arch = SHAPES_VQA_QWEN3_DEEP_ARCH if table_scale is None else dict(SHAPES_VQA_QWEN3_DEEP_ARCH, position_table_scale=table_scale)
    if word_tokens:
        arch = dict(arch, word_tokens=True)
    if table_init:
        arch = dict(arch, position_table_init=table_init)
    data = {"aux_types": [aux] if isinstance(aux, str) else list(aux), **({"every_types": list(every_types)} if every_types else {}),
            **({"phases": [[list(t), k] for t, k in phases]} if phases else {})}
    return TinySpec(name=name, family="vlm", task="shapes_vqa", arch=arch, steps=steps, lr=2e-3, batch_size=32,
                    gen_length=10, data=data,
                    description=description + ' (docs/RESULTS.md, "Issue 25, item 5": the column question)')


def _sudoku4(name: str, steps: int, description: str) -> TinySpec:
    """A Sudoku base: `SUDOKU4_ARCH` pre-trained with LLaDA's SFT loss on the 1-10-blank puzzles of the training
    grids for `steps` steps; the bases differ only in their steps."""
    return TinySpec(name=name, family="masked_diffusion", task="sudoku4", arch=SUDOKU4_ARCH, steps=steps, gen_length=16,
                    pretrain_filter={"blanks": [1, 10]}, description=description)


TINY_MODELS: dict[str, TinySpec] = {
    "sudoku4": _sudoku4(
        "sudoku4", 150,
        "bidirectional Llama (4 layers, 128 wide, 0.6M parameters), LLaDA SFT (150 steps, about 25 s on 2 cores) on 4x4 "
        "puzzles with 1-10 blanks from the training grids; 0.50 cell accuracy on the held-out 6-10 blank test puzzles "
        "(300 steps reach 0.73; 300 steps on 1-5 blanks only: 0.30)"),
    "sudoku4-strong": _sudoku4(
        "sudoku4-strong", 1200,
        "the `sudoku4` model, data and LLaDA recipe at 1200 steps instead of 150 (173-186 CPU s on one core): the "
        "competent masked-diffusion Sudoku base, 0.994 cell accuracy and 0.988 of the 256 validation puzzles solved "
        "(low-confidence greedy; the causal LM of the same size on the same puzzles at the same steps: 0.898 / 0.785); "
        "docs/RESULTS.md, \"The Sudoku base re-examined\""),
    "sudoku4-mid": _sudoku4(
        "sudoku4-mid", 300,
        "the `sudoku4` model, data and LLaDA recipe at 300 steps instead of 150 (about 45 CPU s on one core): a base "
        "with headroom for RL, 0.718 cell accuracy and 0.355 of the 256 validation puzzles solved (low-confidence "
        "greedy; the 300-step point of docs/RESULTS.md, \"The Sudoku base re-examined\", chosen there on validation)"),
    "countdown3": TinySpec(
        name="countdown3", family="masked_diffusion", task="countdown3",
        arch=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4),
        steps=300, gen_length=16,
        description="bidirectional Llama (4 layers, 128 wide) for 3-number Countdown expressions",
    ),
    "countdown3-md": TinySpec(
        name="countdown3-md", family="masked_diffusion", task="countdown3",
        arch=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                  shift_logits=True),
        steps=600, gen_length=16, recipe={"ar_init_steps": 600, "time_weight": "none", "normalise": "masked"},
        description="bidirectional Llama (4 layers, 128 wide) with Dream's shifted logits for 3-number Countdown, "
                    "AR-to-diffusion adaptation: 600 causal next-token steps on the same backbone, then 600 masked-"
                    "diffusion steps (mean CE over masked tokens, no 1/t); the masked-diffusion base that reads and "
                    "copies its prompt (docs/RESULTS.md, dLLM section)",
    ),
    "countdown3-ar": TinySpec(
        name="countdown3-ar", family="causal_lm", task="countdown3",
        arch=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4),
        steps=600, gen_length=16,
        description="causal Qwen2 (4 layers, 128 wide) for 3-number Countdown expressions, 600 steps (about 85 s on one "
                    "core): held-out 0.25 greedy, 0.14 sampled at T = 1, pass@16 0.60 (the regime where RL sharpens; "
                    "300 steps: 0.18 / 0.07 / 0.44)",
    ),
    "countdown3-ar-lazy": TinySpec(
        name="countdown3-ar-lazy", family="causal_lm", task="countdown3",
        arch=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4),
        steps=1200, gen_length=16, data={"lazy_frac": 0.5, "lazy_op": "*"},
        description="countdown3-ar's model on imperfect demonstrations, 1200 steps (about 3 min on one core): half the "
                    "targets come from a shortcut demonstrator that multiplies the numbers, `(a*b)*c` (right for 0.4% "
                    "of the problems), so the base's single most likely answer is the wrong shortcut while it still "
                    "writes right answers when sampled: held-out 0.02 greedy, 0.07 sampled at T = 1, pass@16 0.49. "
                    "The Countdown comparisons' base (docs/RESULTS.md)",
    ),
    "countdown3-ar-clean": TinySpec(
        name="countdown3-ar-clean", family="causal_lm", task="countdown3",
        arch=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4),
        steps=1200, gen_length=16,
        description="countdown3-ar-lazy's model and compute (1200 steps, same seed) on right answers only: the clean "
                    "SFT reference of the Countdown comparisons (\"share of the gap closed\")",
    ),
    "countdown4-steps-ar": TinySpec(
        name="countdown4-steps-ar", family="causal_lm", task="countdown4_steps",
        arch=dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4),
        steps=1500, batch_size=32, gen_length=170, recipe={"trim_padding": True},
        description="causal Qwen2 (4 layers, 128 wide) for four-number Countdown with the working written out digit by "
                    "digit (countdown4_steps v2, answers of 60-160 tokens; issue 25's long-answer base), 1500 steps "
                    "of 32 demonstrations, each batch cut to its longest row (763 CPU s, final loss 0.09); on the 300 "
                    "validation problems 0.21 greedy, sampled pass@1 0.09 and pass@16 0.57 at T = 1, answers of 73 "
                    "(greedy) / 79 (sampled) tokens (docs/RESULTS.md; `python scripts/studies/countdown4_steps_base.py`)",
    ),
    "shapes": TinySpec(
        name="shapes", family="janus", task="shapes",
        arch=dict(codec="slots", hidden_size=128, num_layers=3, num_heads=4, init_std=0.08, image_positions_2d=True),
        steps=1000, lr=2e-3, gen_length=16, data={"caption_noise": 0.3, "balance_tasks": True},
        description="JanusForConditionalGeneration (3 layers, 128 wide, word tokenizer) over 4x4 object slots (a "
                    "22-patch codebook: empty or one shape in one colour, mmrl.tiny_world.shape_slots) with 2-D image "
                    "positions; 1000 steps on scenes whose captions are wrong 30% of the time: 0.53-0.55 held-out "
                    "GenEval (T = 1, CFG 1; counting, position and colour attribution below 0.4), about 150 s on one core",
    ),
    "shapes-clean": TinySpec(
        name="shapes-clean", family="janus", task="shapes",
        arch=dict(codec="slots", hidden_size=128, num_layers=3, num_heads=4, init_std=0.08, image_positions_2d=True),
        steps=1000, lr=2e-3, gen_length=16, data={"balance_tasks": True},
        description="the `shapes` base pre-trained at the same compute (1000 steps of 64 scenes, same seed) on "
                    "correct captions only: the reference an RL run from the noisy base must be compared with "
                    "(\"share of the gap closed\"); also a base to run RL from",
    ),
    "shapes-masked": TinySpec(
        name="shapes-masked", family="masked_image", task="shapes",
        arch=SHAPES_MASKED_ARCH,
        steps=1500, lr=2e-3, gen_length=16, data={"caption_noise": 0.3, "balance_tasks": True},
        description="tiny aMUSEd (diffusers UVit2DModel, 3 layers x 128, 1.7M parameters, and a 2-layer CLIP text "
                    "encoder with a word vocabulary) over the 4x4 object slots of mmrl.tiny_world.shape_slots (the 22-patch "
                    "codebook as an exact fixed VQ codebook), init std 0.08; 1500 steps of MaskGIT training on scenes "
                    "whose captions are wrong 30% of the time; 8 sampling steps; held-out GenEval 0.22 at CFG 1, 0.46 "
                    "at CFG 2, 0.53 at CFG 3 (32 images per task); about 7.5 min on one core",
    ),
    "shapes-masked-clean": TinySpec(
        name="shapes-masked-clean", family="masked_image", task="shapes",
        arch=SHAPES_MASKED_ARCH,
        steps=1500, lr=2e-3, gen_length=16, data={"balance_tasks": True},
        description="the `shapes-masked` base pre-trained at the same compute (1500 MaskGIT steps of 64 scenes, same "
                    "seed) on correct captions only: the clean-data reference of `dmpo-vs-grpo-masked` (\"share of the "
                    "gap closed\")",
    ),
    "shapes-vqa": TinySpec(
        name="shapes-vqa", family="vlm", task="shapes_vqa",
        arch=SHAPES_VQA_ARCH,
        steps=800, lr=2e-3, batch_size=32, gen_length=10,
        data={"label_noise": 0.3, "first_types": ["colour"], "first_steps": 200},
        description="Qwen2_5_VLForConditionalGeneration (text 2 layers x 64, vision 2 blocks x 64 on 4-pixel patches "
                    "of 48 px scenes, one patch per cell: 36 image tokens), 800 steps of answer cross-entropy on "
                    "shapes_vqa with 30% wrong labels, the first 200 on colour questions only (a curriculum: on the "
                    "uniform mix alone the model answers each question type's prior and never reads the image); "
                    "reads colour well above chance (docs/RESULTS.md, \"Tiny VLM\")",
    ),
    "shapes-vqa-reads": _vqa_reads_spec(
        "shapes-vqa-reads", SHAPES_VQA_ARCH,
        "the `shapes-vqa` model with a per-type curriculum (issue 25 item 5): 200 steps on each question "
        "type alone (colour, shape, count, position) on true labels, then 800 on the mix with 30% wrong "
        "labels (1600 steps of 32), 317 CPU s; issue 25 item 5's first base variant: on validation it "
        "reads colour (+27.7 points over the majority answer) but answers shape and position with the "
        "majority answer and count below it (docs/RESULTS.md, \"Issue 25, item 5\")"),
    "shapes-vqa-reads-wide": _vqa_reads_spec(
        "shapes-vqa-reads-wide", SHAPES_VQA_WIDE_ARCH,
        "`shapes-vqa-reads` (the per-type curriculum on true labels, then the mix with 30% wrong labels, "
        "1600 steps of 32) on a model twice as wide (text and vision 128, 0.99M parameters): issue 25 "
        "item 5's second base variant, 689 CPU s; on validation every type at its majority answer, colour "
        "included (docs/RESULTS.md, \"Issue 25, item 5\")"),
    "shapes-vqa-reads-deep": _vqa_reads_spec(
        "shapes-vqa-reads-deep", SHAPES_VQA_DEEP_ARCH,
        "`shapes-vqa-reads` (the per-type curriculum on true labels, then the mix with 30% wrong labels, "
        "1600 steps of 32) with a vision tower of 4 blocks instead of 2: issue 25 item 5's third base "
        "variant, 449 CPU s; on validation colour +13.3 points over the majority answer, count -2.0, shape "
        "+1.1, position the majority answer; the base of gcpo-vs-grpo-vqa-reads (docs/RESULTS.md, "
        "\"Issue 25, item 5\")"),
    "shapes-vqa-reads-shape": _vqa_reads_spec(
        "shapes-vqa-reads-shape", SHAPES_VQA_DEEP_ARCH,
        "`shapes-vqa-reads-deep` with a longer curriculum on true labels (`SHAPES_VQA_SHAPE_PHASES`: colour 200, "
        "shape 1000, count 400, position 400 steps), then 800 steps of the mix with 30% wrong labels (2800 steps of "
        "32): issue 25 item 5's fourth base variant (docs/RESULTS.md, \"Issue 25, item 5\")", SHAPES_VQA_SHAPE_PHASES),
    "shapes-vqa-qwen3": TinySpec(
        name="shapes-vqa-qwen3", family="vlm", task="shapes_vqa", arch=SHAPES_VQA_QWEN3_DEEP_ARCH,
        steps=10000, lr=2e-3, batch_size=32, gen_length=10,
        description="a tiny Qwen3-VL (`SHAPES_VQA_QWEN3_DEEP_ARCH`: vision 4 blocks x 64 with learned absolute "
                    "positions and DeepStack, text 4 layers x 64), 10,000 steps of answer cross-entropy on the "
                    "uniform mix of shapes_vqa's four question types with true labels (no curriculum, no label "
                    "noise), 2,591 CPU s: issue 25 item 5's base that reads its image. Validation, greedy: count 0.980, "
                    "colour 0.976 [0.940, 1.000] (chance 1/7), shape 0.989, far above their majority answers; position "
                    "0.453, at its majority answer (memorised on the training rows, final loss 0.003, not generalised; "
                    "docs/RESULTS.md, \"Issue 25, item 5\": the Qwen3-VL probes and the base)"),
    "shapes-vqa-qwen3-col": _vqa_column_spec(
        "shapes-vqa-qwen3-col", 6000, "column", None,
        "`shapes-vqa-qwen3`'s model and true-label mix at 6,000 steps, with one pre-training-only question per "
        "training scene, \"column of the red one?\" -> \"0\" .. \"9\" (`shapes_vqa.AUX_QUESTION_TYPES`): ten about "
        "equally likely answers, so the model must read where an object is. 2,183 CPU s; validation: the column "
        "question 0.181, position at its majority answer"),
    "shapes-vqa-qwen3-col50": _vqa_column_spec(
        "shapes-vqa-qwen3-col50", 6000, "column", 50.0,
        "`shapes-vqa-qwen3-col` with the vision tower's position table initialised 50 times larger (std 1.0 instead "
        "of 0.02; probe v50's table, whose trained features carry the column). 2,198 CPU s; validation: the column "
        "question 0.394 (ten answers), position at its majority answer"),
    "shapes-vqa-qwen3-col50-long": _vqa_column_spec(
        "shapes-vqa-qwen3-col50-long", 10000, "column", 50.0,
        "`shapes-vqa-qwen3-col50` at `shapes-vqa-qwen3`'s 10,000 steps instead of 6,000. 3,728 CPU s; validation: "
        "count / colour / shape 0.97 / 0.95 / 0.99, the column question 0.160, position 0.594 (+6.2 [-12.5, +23.4] "
        "over its majority)"),
    "shapes-vqa-qwen3-named50-long": _vqa_column_spec(
        "shapes-vqa-qwen3-named50-long", 10000, "column_named", 50.0,
        "`shapes-vqa-qwen3-col50-long` with the column question naming its object as a position question does, by "
        "colour and shape (\"column of the red circle?\"). 3,710 CPU s; validation: count / colour / shape 0.94 / "
        "0.99 / 0.99, the column question 0.182, position at its majority answer"),
    "shapes-vqa-qwen3-words50": _vqa_column_spec(
        "shapes-vqa-qwen3-words50", 10000, "column_named", 50.0,
        "`shapes-vqa-qwen3-named50-long` with one token per word (`shapes_vqa.vocabulary()`, 35 words) instead of one "
        "per character: a position question is 9 tokens, not 42, and \"red circle\" two tokens the text model need "
        "not compose from letters", word_tokens=True),
    "shapes-vqa-qwen3-words50-pairs": _vqa_column_spec(
        "shapes-vqa-qwen3-words50-pairs", 10000, "column_named", 50.0,
        "`shapes-vqa-qwen3-words50` with every position question the training scenes support in the mix (9,894 "
        "ordered pairs of 2,976 scenes, against the task's one per scene)", word_tokens=True, every_types=("position",)),
    "shapes-vqa-qwen3-words-sincos": _vqa_column_spec(
        "shapes-vqa-qwen3-words-sincos", 10000, "column_named", 3.0,
        "`shapes-vqa-qwen3-words50` with the vision position table initialised to MAE's 2-D sine-cosine code times 3 "
        "(`image_positions.sincos_2d`) instead of a random draw times 50: a code smooth in the column, in which "
        "left-of is near linear", word_tokens=True, table_init="sincos"),
    "shapes-vqa-qwen3-words-sincos-pairs": _vqa_column_spec(
        "shapes-vqa-qwen3-words-sincos-pairs", 10000, "column_named", 3.0,
        "`shapes-vqa-qwen3-words-sincos` with every position question the training scenes support in the mix "
        "(as `shapes-vqa-qwen3-words50-pairs`)", word_tokens=True, every_types=("position",), table_init="sincos"),
    "shapes-vqa-qwen3-col50-pairs": _vqa_column_spec(
        "shapes-vqa-qwen3-col50-pairs", 6000, "column", 50.0,
        "`shapes-vqa-qwen3-col50` (char tokens, 6,000 steps: the base whose merged image features carry the column, "
        "read-out 0.964) with every position question the training scenes support in the mix (9,894 ordered pairs)",
        every_types=("position",)),
    "shapes-vqa-qwen3-col50-pairs-named": _vqa_column_spec(
        "shapes-vqa-qwen3-col50-pairs-named", 6000, ("column", "column_named"), 50.0,
        "`shapes-vqa-qwen3-col50-pairs` with the column question also asked of objects named by colour and shape, "
        "as a position question names them (one of each per training scene)", every_types=("position",)),
    "shapes-vqa-qwen3-side50": _vqa_column_spec(
        "shapes-vqa-qwen3-side50", 7000, ("side_one", "side"), 50.0,
        "`shapes-vqa-qwen3`'s model and true-label mix, the vision position table x 50, with a curriculum that first "
        "teaches where ONE object is: 1,000 steps of \"side of the red one?\" on one-object scenes (`side_one`, learnt "
        "within 1,000 steps in the one-object study), 1,000 steps of it beside the same question in scenes of 1-4 "
        "objects (`side`), then 5,000 steps of the four task types with both side questions in the mix. 2,430 CPU s; "
        "validation: position 0.688 (+15.6 [-3.1, +32.8] over its majority answer), colour 0.602, count and shape at "
        "their majority answers", phases=SHAPES_VQA_SIDE_PHASES),
    "shapes-vqa-qwen3-side50-pairs": _vqa_column_spec(
        "shapes-vqa-qwen3-side50-pairs", 7000, ("side_one", "side"), 50.0,
        "`shapes-vqa-qwen3-side50` with every position question the training scenes support in the mix. 2,435 CPU s; "
        "validation: position 0.859 [0.781, 0.938] (+32.8 [+17.2, +46.9] over its majority answer: the first base that "
        "reads left / right), colour 0.554, count and shape not above their majority answers; the base of "
        "gcpo-vs-grpo-vqa-side50", every_types=("position",), phases=SHAPES_VQA_SIDE_PHASES),
    "shapes-vqa-qwen3-side50-pairs-long": _vqa_column_spec(
        "shapes-vqa-qwen3-side50-pairs-long", 10000, ("side_one", "side"), 50.0,
        "`shapes-vqa-qwen3-side50-pairs` at 10,000 steps instead of 7,000 (8,000 of the mix instead of 5,000): at 7,000 "
        "it reads position and the side questions, while count, colour and shape, which get a third of the mix, are "
        "still rising. 3,852 CPU s; validation: colour 0.735, shape 0.660 and position 0.906 (+37.5 [+23.4, +51.6]) "
        "above their majority answers, count 0.600 not (+9.0 [-5.0, +23.0])",
        every_types=("position",), phases=SHAPES_VQA_SIDE_PHASES),
    "shapes-vqa-qwen3-side50-every": _vqa_column_spec(
        "shapes-vqa-qwen3-side50-every", 10000, ("side_one", "side"), 50.0,
        "`shapes-vqa-qwen3-side50-pairs-long` with every question of every task type the training scenes support in "
        "the mix, not only every position pair (count 8,928 rows, shape 5,502, colour 3,615, position 9,894, beside the "
        "task's one per scene and type): count, a tenth of that build's mix and the one type it left at its majority "
        "answer, becomes about a quarter of it. 4,289 CPU s; validation: count 0.830, colour 0.892, shape 0.862, position "
        "0.875, every type above its majority answer (smallest lower bound +18.8 points, position): issue 25 item 5's "
        "adopted base, the base of gcpo-vs-grpo-vqa-every", every_types=VQA_QUESTION_TYPES,
        phases=SHAPES_VQA_SIDE_PHASES),
    "shapes-vqa-qwen3-side50-every-long": _vqa_column_spec(
        "shapes-vqa-qwen3-side50-every-long", 12000, ("side_one", "side"), 50.0,
        "`shapes-vqa-qwen3-side50-every` at 12,000 steps instead of 10,000 (10,000 of the mix). 5,089 CPU s; validation: "
        "colour 0.831, shape 0.851 and position 0.922 above their majority answers, count 0.630 not (+12.0 [-1.0, +25.0])",
        every_types=VQA_QUESTION_TYPES, phases=SHAPES_VQA_SIDE_PHASES),
}
"""name -> spec of the tiny base models."""

SHORTCUT_OPS = ("+", "*")
"""Operators of countdown3's shortcut demonstrator (`data={"lazy_frac": f, "lazy_op": op}`)."""


def shortcut_answer(numbers: Sequence[int], op: str) -> str:
    """The shortcut demonstrator's answer `(a op b) op c`, the numbers in the prompt's order: with "+" right when
    they add up to the target (13% of countdown3's problems), with "*" almost never (0.4%)."""
    a, b, c = numbers
    return f"({a}{op}{b}){op}{c}"


_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


def cache_root() -> Path:
    return Path(os.environ.get("MMRL_CACHE", Path.home() / ".cache" / "mmrl")) / "tiny_world"


def spec_for(name: str) -> TinySpec:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"invalid tiny-world model name {name!r}; valid: {sorted(TINY_MODELS)}")
    if name not in TINY_MODELS:
        raise ValueError(f"unknown tiny-world model {name!r}; valid: {sorted(TINY_MODELS)}")
    return TINY_MODELS[name]


SMOKE_BASE_STEPS = 20
"""Pre-training steps of every smoke base (`smoke_spec`): the `--smoke` runs check the pipeline, not the model."""


def smoke_spec(name: str, steps: int) -> TinySpec:
    """The spec of `name` pre-trained for only `steps` steps (cached under its own key): pipeline checks (CI)."""
    from dataclasses import replace

    spec = spec_for(name)
    recipe = dict(spec.recipe)
    if recipe.get("ar_init_steps"):  # the causal phase shrinks with the rest
        recipe["ar_init_steps"] = min(int(recipe["ar_init_steps"]), int(steps))
    data = dict(spec.data)
    if data.get("first_steps"):  # so does the curriculum's first phase
        data["first_steps"] = min(int(data["first_steps"]), int(steps))
    if data.get("phases"):  # and its phases: each cut to the steps left, those left with none dropped
        left, phases = int(steps), []
        for types, k in data["phases"]:
            if min(int(k), left) >= 1:
                phases.append([list(types), min(int(k), left)])
                left -= phases[-1][1]
        data["phases"] = phases
    if data.get("clean_steps"):
        data["clean_steps"] = min(int(data["clean_steps"]), int(steps))
    return replace(spec, steps=int(steps), recipe=recipe, data=data, description=f"{name} pre-trained for {steps} steps (smoke)")


def _spec(name: str, steps: int | None) -> TinySpec:
    return spec_for(name) if steps is None else smoke_spec(name, steps)


def model_dir(name: str, steps: int | None = None) -> Path:
    spec = _spec(name, steps)
    return cache_root() / f"{spec.name}-{spec.key()}"


def _adapter_class(family: str):
    from mmrl.models import adapter_class

    return adapter_class(family)


def build_untrained(spec: TinySpec):
    """The randomly initialised adapter of a spec."""
    cls = _adapter_class(spec.family)
    if spec.family == "masked_diffusion":
        return cls.tiny(seed=spec.seed, gen_length=spec.gen_length, block_length=spec.gen_length, steps=spec.gen_length, **spec.arch)
    if spec.family == "causal_lm":
        return cls.tiny(seed=spec.seed, max_new_tokens=spec.gen_length, **spec.arch)
    if spec.family == "janus":
        arch = dict(spec.arch)
        if arch.pop("codec", "palette") == "slots":
            import mmrl.tiny_world.tasks  # noqa: F401  (the tiny world's own tasks, registered by their module)
            from mmrl.tiny_world import shape_slots
            from mmrl.data.tasks import load_task
            from mmrl.models.image_codecs import PatchCodec

            task = load_task(spec.task)
            codec = PatchCodec(shape_slots.codebook_patches(), grid=(shape_slots.SLOTS, shape_slots.SLOTS))
            vocabulary = [r["prompt"] for r in task.train + task.test]  # the words, not the split: no leak
            return cls.tiny(seed=spec.seed, codec=codec, vocabulary=vocabulary, cfg_scale=1.0, **arch)
        from mmrl.tiny_world.shapes import PALETTE

        return cls.tiny(seed=spec.seed, codebook_size=len(PALETTE), palette=[rgb for _, rgb in PALETTE], cell_px=8, **arch)
    if spec.family == "vlm":
        arch = dict(spec.arch)
        scale, init = arch.pop("position_table_scale", None), arch.pop("position_table_init", None)
        if init not in (None, "sincos"):
            raise ValueError(f"spec {spec.name!r}: position_table_init must be 'sincos' or absent (the model's own "
                             f"random init), got {init!r}")
        if arch.pop("word_tokens", False):  # one token per word of the task's closed vocabulary
            if spec.task != "shapes_vqa":
                raise ValueError(f"spec {spec.name!r}: word_tokens needs the shapes_vqa task's vocabulary, not task {spec.task!r}")
            from mmrl.tiny_world.shapes_vqa import vocabulary

            arch["words"] = vocabulary()
        policy = cls.tiny(seed=spec.seed, max_new_tokens=spec.gen_length, **arch)
        if scale is not None or init is not None:  # the learned table starts at std 0.02 against about 3 for the patch embeddings
            import torch

            visual = policy.model.model.visual
            if not hasattr(visual, "pos_embed"):
                raise ValueError(f"spec {spec.name!r}: position_table_scale / position_table_init need a vision tower with an "
                                 f"absolute position table (model_type qwen3_vl), not {type(visual).__name__}")
            with torch.no_grad():
                if init == "sincos":  # the table's row r * side + c is patch (r, c) (Qwen3-VL's interpolation indices)
                    from mmrl.models.image_positions import sincos_2d

                    n, dim = visual.pos_embed.weight.shape
                    visual.pos_embed.weight.copy_(sincos_2d(round(n ** 0.5), dim))
                visual.pos_embed.weight.mul_(float(1.0 if scale is None else scale))
        return policy
    if spec.family == "masked_image":
        import mmrl.tiny_world.tasks  # noqa: F401  (the tiny world's own tasks, registered by their module)
        from mmrl.tiny_world import shape_slots
        from mmrl.data.tasks import load_task
        from mmrl.models.clip_tokenizer import words_of
        from mmrl.models.image_codecs import PatchCodec

        task = load_task(spec.task)
        codec = PatchCodec(shape_slots.codebook_patches(), grid=(shape_slots.SLOTS, shape_slots.SLOTS))
        words = words_of([r["prompt"] for r in task.train + task.test])  # the words, not the split: no leak
        return cls.tiny(seed=spec.seed, codec=codec, words=words, cfg_scale=1.0, **spec.arch)
    raise ValueError(f"no tiny builder for family {spec.family!r}")


def _training_pairs(spec: TinySpec) -> tuple[list, list]:
    from mmrl.data.tasks import load_task
    import mmrl.tiny_world.tasks  # noqa: F401  (the tiny world's own tasks, registered by their module)

    task = load_task(spec.task)
    rows = task.train
    if spec.task == "sudoku4":
        lo, hi = spec.pretrain_filter.get("blanks", [1, 16])
        from mmrl.tiny_world.tasks import sudoku4_causal_row, sudoku4_row, sudoku_puzzles, sudoku_split

        if spec.pretrain_filter:
            train_grids, _, _ = sudoku_split(seed=0)
            pairs = sudoku_puzzles(train_grids, 8000, (lo, hi), seed=7)  # same training grids, other blank counts
            rows = [sudoku4_row(p, s) for p, s in pairs]
        if spec.family == "causal_lm":  # the same puzzles posed to a causal LM: the puzzle in the prompt
            rows = [sudoku4_causal_row(r["puzzle"], r["solution"]) for r in rows]
        return [r["prompt"] for r in rows], [r["solution"] for r in rows]
    if spec.task == "countdown3":
        targets = [r["solution"] for r in rows]
        noise = float(spec.data.get("label_noise", 0.0))
        if noise:  # imperfect demonstrations: a wrong but well-formed expression for a fixed share of the rows
            import random

            from mmrl.tiny_world.tasks import wrong_solution

            rng = random.Random(spec.seed + 1)
            for i, r in enumerate(rows):
                if rng.random() < noise:
                    targets[i] = wrong_solution(r["numbers"], r["target"], rng) or targets[i]
        lazy = float(spec.data.get("lazy_frac", 0.0))
        op = spec.data.get("lazy_op", "+")
        if not 0.0 <= lazy < 1.0:
            raise ValueError(f"countdown3's lazy_frac must lie in [0, 1), got {lazy}")
        if op not in SHORTCUT_OPS:
            raise ValueError(f"countdown3's lazy_op must be one of {SHORTCUT_OPS}, got {op!r}")
        if lazy:  # a second, shortcut demonstrator that applies one operator to the numbers in the prompt's order
            import random

            rng = random.Random(spec.seed + 2)
            for i, r in enumerate(rows):
                if rng.random() < lazy:
                    targets[i] = shortcut_answer(r["numbers"], op)
        return [r["prompt"] for r in rows], targets
    if spec.task == "countdown4_steps":
        return [r["prompt"] for r in rows], [r["solution"] for r in rows]
    if spec.task == "shapes":
        return [r["prompt"] for r in rows], [r["metadata"] for r in rows]
    if spec.task == "shapes_vqa":
        rows = _vqa_rows(spec)
        return [r["prompt"] for r in rows], [r["answer"] for r in rows]
    raise ValueError(f"no pre-training data for task {spec.task!r}")


def pretrain(spec: TinySpec, *, progress: bool = True, curve: Callable | None = None, curve_every: int = 0,
             keep_optimizer: Callable | None = None):
    """Build and pre-train the model of `spec`; returns (policy, history). `curve(policy) -> eval_fn` adds an
    evaluation every `curve_every` steps to the history (the masked-diffusion and causal loops; learning curves).
    `keep_optimizer(opt)` receives the final AdamW of the families in `mmrl.tiny_world.sources.OPTIMIZER_STATE_FAMILIES`."""
    from mmrl.tiny_world import pretrain as pt

    policy = build_untrained(spec)
    prompts, targets = _training_pairs(spec)
    kw = dict(steps=spec.steps, batch_size=spec.batch_size, lr=spec.lr, seed=spec.seed, progress=progress, desc=f"pretrain {spec.name}")
    if curve is not None and spec.family in ("masked_diffusion", "causal_lm", "vlm"):
        kw.update(eval_fn=curve(policy), eval_every=int(curve_every))
    if spec.family == "masked_diffusion":
        history = pt.masked_diffusion_sft(policy, prompts, targets, gen_length=spec.gen_length, keep_optimizer=keep_optimizer,
                                          **kw, **spec.recipe)
    elif spec.family == "causal_lm":
        history = pt.causal_sft(policy, prompts, targets, keep_optimizer=keep_optimizer, **kw, **spec.recipe)
    elif spec.family == "janus":
        history = pt.janus_sft(policy, prompts, targets, **kw, **_shapes_data(spec, policy))
    elif spec.family == "masked_image":
        from mmrl.tiny_world.masked_image_pretrain import masked_image_sft

        history = masked_image_sft(policy, prompts, targets, **kw, **_shapes_data(spec, policy))
    elif spec.family == "vlm":
        from mmrl.tiny_world.vlm_pretrain import vlm_sft

        history = vlm_sft(policy, prompts, targets, **kw, **_vqa_data(spec))
    else:  # pragma: no cover - every family of TINY_MODELS is handled above
        raise ValueError(spec.family)
    return policy, history


def _shapes_data(spec: TinySpec, policy) -> dict:
    """janus_sft's data options for a shapes spec: slot scenes for a slot codec, noisy captions."""
    from functools import partial

    from mmrl.tiny_world import caption_noise, shape_slots
    from mmrl.tiny_world.shapes import COLORS, SHAPE_NAMES

    out: dict = {}
    if policy.codec.grid == (shape_slots.SLOTS, shape_slots.SLOTS) and policy.codec.codebook_size == shape_slots.NUM_CODES:
        out["draw_tokens"] = shape_slots.slot_codes_for_metadata
    if spec.data.get("balance_tasks"):  # as many rows of single objects as of colour attribution
        out["groups"] = [r["tag"] for r in _training_pairs(spec)[1]]
    noise = float(spec.data.get("caption_noise", 0.0))
    if noise:
        out["caption_noise"] = noise
        from mmrl.tiny_world.tasks import SHAPES_COUNTS

        out["corrupt"] = partial(caption_noise.corrupt, classnames=SHAPE_NAMES, colors=COLORS, max_count=max(SHAPES_COUNTS))
    return out


def _vqa_rows(spec: TinySpec) -> list[dict]:
    """shapes_vqa's pre-training rows: the training split, then one question of each pre-training-only type in
    `data["aux_types"]` per training scene that supports it (`shapes_vqa.auxiliary_rows`), then every question of each
    task type in `data["every_types"]` that the training scenes support (`shapes_vqa.every_question_rows`)."""
    from mmrl.data.tasks import load_task
    from mmrl.tiny_world.shapes_vqa import AUX_QUESTION_TYPES, QUESTION_TYPES, auxiliary_rows, every_question_rows

    aux, every = list(spec.data.get("aux_types", [])), list(spec.data.get("every_types", []))
    if bad := [t for t in aux if t not in AUX_QUESTION_TYPES]:
        raise ValueError(f"spec {spec.name!r}: aux_types must be among {AUX_QUESTION_TYPES}, got {bad}")
    if bad := [t for t in every if t not in QUESTION_TYPES]:
        raise ValueError(f"spec {spec.name!r}: every_types must be among {QUESTION_TYPES}, got {bad}")
    return (list(load_task(spec.task).train) + [r for t in aux for r in auxiliary_rows(t, "train")]
            + [r for t in every for r in every_question_rows(t, "train")])


def _vqa_data(spec: TinySpec) -> dict:
    """vlm_sft's data options for a shapes_vqa spec: noisy labels (`label_noise`: a wrong answer of the row's question
    type; `clean_steps`: the first steps on true labels), and the question-type curriculum, either `first_types`,
    `first_steps` (the first steps on those types only) or `phases`, a list of `[types, steps]` run in order before
    the mix (e.g. `[[["colour"], 150], [["shape"], 150], [["count"], 200], [["position"], 200]]`)."""
    from mmrl.tiny_world.shapes_vqa import AUX_QUESTION_TYPES, QUESTION_TYPES, wrong_answer

    rows = _vqa_rows(spec)
    out: dict = {}
    first = list(spec.data.get("first_types", []))
    phases = [(list(types), int(k)) for types, k in spec.data.get("phases", [])]
    if first and phases:
        raise ValueError(f"spec {spec.name!r}: give shapes_vqa's curriculum as first_types / first_steps or as phases, not both")
    if bad := [t for t in first + [t for types, _ in phases for t in types] if t not in QUESTION_TYPES + AUX_QUESTION_TYPES]:
        raise ValueError(f"shapes_vqa's curriculum types (first_types, phases) must be among {QUESTION_TYPES + AUX_QUESTION_TYPES}, got {bad}")
    if first:
        out.update(groups=[r["qtype"] for r in rows], first_groups=first, first_steps=int(spec.data.get("first_steps", 0)))
    if phases:
        out.update(groups=[r["qtype"] for r in rows], phases=phases)
    noise = float(spec.data.get("label_noise", 0.0))
    if noise:
        out.update(label_noise=noise, corrupt=lambda i, rng: wrong_answer(rows[i]["answer"], rows[i]["qtype"], rng))
    if spec.data.get("clean_steps"):
        out["clean_steps"] = int(spec.data["clean_steps"])
    return out


def ensure_built(name: str, *, force: bool = False, progress: bool = True, steps: int | None = None,
                 curve: Callable | None = None, curve_every: int = 0) -> Path:
    """The cache directory of model `name`, pre-training it first if it is missing (or `force`); `steps` builds
    the smoke variant (`smoke_spec`). A cached model is checked against its manifest (size and SHA-256 of every
    file, `mmrl.checkpointing.checkpoint.write_manifest`) before it is used; a damaged one is rebuilt, with a warning naming the
    file. A cache written before manifests existed is checked by loading it, then given a manifest. `curve`,
    `curve_every`: `pretrain`'s learning-curve hook; the evaluations land in `tiny_spec.json` ("curve")."""
    spec = _spec(name, steps)
    final = model_dir(name, steps)
    if final.is_dir() and (final / "tiny_spec.json").is_file() and not force:
        if _cache_intact(final, spec):
            return final
        force = True
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    optimizers: list = []
    with _one_torch_thread():
        policy, history = pretrain(spec, progress=progress, curve=curve, curve_every=curve_every, keep_optimizer=optimizers.append)
    policy.save_pretrained(tmp)
    if optimizers:  # the final AdamW state, for RL runs that start from it (`init_optimizer_from_base`)
        save_adamw_state(policy.model, optimizers[-1], tmp)
    digest = weights_digest(tmp)
    info = {"spec": asdict(spec), "seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - cpu0,
            "final_loss": history[-1]["loss"] if history else None, "weights_sha256": digest,
            "torch": _torch_version()}
    _compare_with_reference(final.name if steps is None else None, digest)
    if curve is not None:
        info["curve"] = [{"step": h["step"], "seconds": h["seconds"], "eval": h["eval"]} for h in history if "eval" in h]
    (tmp / "tiny_spec.json").write_text(json.dumps(info, indent=2, default=str))
    write_manifest(tmp)
    if final.exists():
        damaged = final.parent / f".damaged-{final.name}-{os.getpid()}"
        final.rename(damaged)  # out of the way at once; a kill during the deletion leaves no half-deleted cache
        shutil.rmtree(damaged, ignore_errors=True)
    tmp.rename(final)
    return final


REFERENCE_BUILDS: dict[tuple[str, str], str] = {
    # built on one thread, torch 2.14.1, x86-64 (the machine behind docs/RESULTS.md's protocol tables, 2026-12-02)
    ("shapes-38b382d914", "2.14.1"): "edd031ceae4ca7269dc283bafac7e8af46acbdf7f5987b87663654830ecb9feb",
    ("shapes-clean-75c2559005", "2.14.1"): "c4af6304446fa51fd7a91725c392eeaa1ddb9d248535368a52e7d9056ab22e9a",
    ("countdown3-ar-lazy-e905b512b6", "2.14.1"): "204e3ae55309d45de2b78dfa01aa7856c192d4955ecda01b14978c6cc15b1c9e",
    ("countdown3-ar-clean-ba1596f4b1", "2.14.1"): "4d905e71e624f3f97003e1eadcf3c5921aa3456e1b24c0873ec6872bc26d2ce1",
    ("countdown3-md-23921e8e27", "2.14.1"): "580b2788de990d58816e4f8be7d4f006f033d5cee4625e8b6a2c732a8ac31571",
    ("shapes-vqa-cd30d55ccb", "2.14.1"): "90f9b1ec4a00cd8e95227cefb6ef4329e0a28bf4f44eb748a59fd96e4651450a",
    ("countdown4-steps-ar-efe17a9124", "2.14.1"): "3f9d7b9c2b09b514ed2b9724b2fa84bfc0c78fd77286f154017bbc19f81ae19e",
    ("sudoku4-strong-78c727ad8c", "2.14.1"): "ee4219ba2128e86af6d3e8ab3577f4aded83a062a73c34c60612cfdd80935db7",
    # the masked image-token bases (2026-12-04; shapes-masked's digest equals the 2026-12-03 build behind its first table)
    ("shapes-masked-92899b88c2", "2.14.1"): "28d2ddcb0ba1a15360e20d5c2a0b55bd52bfd6daf8fe3489a65e40114a332525",
    ("shapes-masked-clean-9557a242ff", "2.14.1"): "1c5844ddc5222486d39c57186613dc94ca6a8bfb1e42c0ada3ec7333a598c9f2",
    # issue 25 item 5's base variants (2026-12-04; one core, niced): the search's figures and the comparison's base (deep)
    ("shapes-vqa-reads-16798b6ad1", "2.14.1"): "4791d909f7701ba8e2fa7589e1325ae1ef0a2a105951ebb9d7fd054bdd5a339a",
    ("shapes-vqa-reads-wide-40ea9de68a", "2.14.1"): "2bfcd9992c050c77dd180d5129924afe4b383a7098cd97c60dfdd699aa8af686",
    ("shapes-vqa-reads-deep-3a5a2b67f2", "2.14.1"): "86c1eb32b5fc81d87eba1c3db399ea5372d2c7881186d4a8e4ce324594d867c4",
    ("shapes-vqa-reads-shape-e9aa9a7f27", "2.14.1"): "4d808d7d65fb6a5a81cf3edc8a1d59f4b73c3282e7a67f49d943244af6a9537b",
    ("shapes-vqa-qwen3-23729edf5d", "2.14.1"): "d8cba83bf1d208e9b351949ce2a617a28ab97a84a8e9d68087f3c5c432dfbd11",
    # the column-question bases (2026-12-07; one core each, niced)
    ("shapes-vqa-qwen3-col-357e7ed45f", "2.14.1"): "4f9e25198bec4c841064063975956b4ec8e7c0590f059da8a89ca50b476b00e2",
    ("shapes-vqa-qwen3-col50-dfb8ab3246", "2.14.1"): "fef1ef12b35c06a8a2f371d77388aa725baf1fd468ccb8ab353085ecf8a447fb",
    ("shapes-vqa-qwen3-col50-long-6655f12315", "2.14.1"): "0610e890d3366fcc864f15412d612e41da4044bf862b62e4046950e43beaa974",
    ("shapes-vqa-qwen3-named50-long-9d5a3494ad", "2.14.1"): "a6bd3a5878fce34f52b3b277ded4f040a8bc148355b301d05611ed02ad1ef434",
    ("shapes-vqa-qwen3-side50-3385c6f6bd", "2.14.1"): "03a8df3bf8ea05349bea2407a4e8fb0e6febffc9248538d91b29b4dacd2a5f8b",
    ("shapes-vqa-qwen3-side50-pairs-1916914817", "2.14.1"): "5b1e62d1d57a757ee1cf1f20ce0cc6be0f0e859cc446050cd346f265e6590ecd",
    ("shapes-vqa-qwen3-side50-pairs-long-25f4dd25f8", "2.14.1"): "0217b2b48789cc58e2f43df3a9ede3afb6e159a716f602c7e01c8031a73c01a6",
    ("shapes-vqa-qwen3-side50-every-e318871e40", "2.14.1"): "5b3af902ffdd17f8a3d574cfa5ebc4a5948a0f0c336a8cfa1a70d8a762c8cc2b",
    ("shapes-vqa-qwen3-side50-every-long-04cfc44688", "2.14.1"): "a8c16a8e3418011dff384d3baa231a92f2f3c1e032ed86ec759caaf048c3397a",
    # the base of "RL on a Sudoku base with headroom" (2026-12-06, one thread; the study's 300-step point, built on
    # another machine, was 6668d1bbcc5b)
    ("sudoku4-mid-5ae77dbef5", "2.14.1"): "efd8766435ee7e09727b8ebd9edb42126eb198f448738a153a8c6905509f6348",
}
"""(cache folder name `<base>-<spec key>`, torch version) -> `weights_digest` of the build behind docs/RESULTS.md's
figures. A build whose digest differs (another CPU's kernels, another library version) is another model:
`ensure_built` warns, since the published figures then are not this base's."""


@contextmanager
def _one_torch_thread():
    """Builds run on one torch thread whatever the caller set: reductions split over threads add in another order
    (a sum of 1e5 floats differs by 1.5e-5 between 1 and 2 threads), and over 1000 Adam steps that is another base
    (issue 23: a fresh-cache quickstart on 2 threads scored 27.3 where the 1-thread base scores 30.5)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _torch_version() -> str:
    import torch

    return str(torch.__version__).split("+")[0]


def weights_digest(path: Path) -> str:
    """SHA-256 over the weight files of a saved model (`*.safetensors`, by relative path, without the pre-training
    optimizer state `OPTIMIZER_FILE`): the build's identity, apart from the timing fields of `tiny_spec.json`; the
    same for a build with or without its optimizer file."""
    h = hashlib.sha256()
    for p in sorted(Path(path).rglob("*.safetensors")):
        if p.name == OPTIMIZER_FILE:
            continue
        h.update(p.relative_to(path).as_posix().encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def _compare_with_reference(name: str | None, digest: str) -> None:
    ref = REFERENCE_BUILDS.get((name, _torch_version())) if name else None
    if ref is not None and ref != digest:
        logger.warning("tiny-world base %s rebuilt here differs from the reference build behind docs/RESULTS.md "
                       "(weights %s..., reference %s...): its figures are this machine's, not the published ones",
                       name, digest[:12], ref[:12])


def _cache_intact(path: Path, spec: TinySpec) -> bool:
    """Whether the cached model at `path` matches its manifest (False, with a warning, when it does not)."""
    try:
        if verify_checkpoint(path):
            return True
        _adapter_class(spec.family).from_pretrained(path)  # no manifest yet (an older cache): loading is the check
    except Exception as e:  # CheckpointDamaged, or a file that does not load
        logger.warning("tiny-world model cache %s is damaged (%s); rebuilding it", path, e)
        return False
    write_manifest(path)
    return True


def load_base_policy(name: str, family: str | None = None, *, progress: bool = True, steps: int | None = None):
    """The pre-trained tiny model `name` as a policy (built and cached on first use; `steps`: the smoke variant)."""
    spec = spec_for(name)
    if family is not None and family != spec.family:
        raise ValueError(f"tiny-world model {name!r} is a {spec.family} model, not {family}")
    path = ensure_built(name, progress=progress, steps=steps)
    return _adapter_class(spec.family).from_pretrained(path)


def held_out_accuracy(name: str) -> dict[str, Any]:
    """Held-out accuracy of the cached base model `name` on its task's test rows: GenEval per task and overall for
    `shapes` (`mmrl.tiny_world.shapes_eval`), the task metric under d1's greedy decoding for the text tasks."""
    import mmrl.tiny_world.tasks  # noqa: F401  (the tiny world's own tasks, registered by their module)
    from mmrl.data.tasks import load_task
    from mmrl.training.evaluate import d1_generation, evaluate

    spec = spec_for(name)
    task = load_task(spec.task)
    policy = load_base_policy(name, progress=False)
    if spec.family in ("janus", "masked_image"):
        from mmrl.tiny_world.shapes_eval import geneval_accuracy

        return {"metric": "GenEval (T=1, CFG 1)", **geneval_accuracy(policy, task.test)[0]}
    gen = d1_generation(spec.family, spec.gen_length, spec.gen_length, spec.gen_length)
    res = evaluate(policy, task.test, task.metric, batch_size=128, progress=False, **gen)
    return {"metric": task.metric, "accuracy": res.accuracy}


def describe() -> list[dict[str, Any]]:
    """One row per tiny model: name, family, task, description, cached or not."""
    out = []
    for name, spec in TINY_MODELS.items():
        d = model_dir(name)
        out.append({"name": name, "family": spec.family, "task": spec.task, "cached": d.is_dir(), "path": str(d), "description": spec.description})
    return out
