"""The shapes world's slot layout for text-to-image RL: the patch codebook, slot scenes, grid inference, caption noise,
the word tokenizer, the tiny Janus's 2-D image positions, the per-task GenEval evaluation and the presets."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from mmrl.tiny_world import caption_noise, shape_slots
from mmrl.tiny_world.shapes import COLORS, GRID, SHAPE_NAMES, Scene, SceneObject, detect, detect_cells, infer_grid
from mmrl.geneval.rules import Detection, judge
from mmrl.models.image_codecs import PatchCodec, codec_from_config

ROOT = Path(__file__).resolve().parents[2]


def _codec() -> PatchCodec:
    return PatchCodec(shape_slots.codebook_patches(), grid=(shape_slots.SLOTS, shape_slots.SLOTS))


def _judge(scene: Scene, record: dict) -> bool:
    dets: dict[str, list] = {}
    for o, box in zip(scene.objects, scene.boxes(shape_slots.SLOT_CELL_PX)):
        dets.setdefault(o.shape, []).append(Detection(o.shape, box, 1.0, o.color))
    return judge(dets, record).correct


# ------------------------------------------------------------------ codes and the patch codec


def test_codes_enumerate_every_shape_and_colour_once():
    assert shape_slots.NUM_CODES == 1 + 20 * 10 == 201
    pairs = [shape_slots.decode_code(c) for c in range(1, shape_slots.NUM_CODES)]
    assert len(set(pairs)) == 200 and shape_slots.decode_code(0) is None
    assert shape_slots.code_of("square", "red") == 1 and shape_slots.code_of("triangle", "white") == 1 + 2 * 10 + 6
    assert all(shape_slots.code_of(*p) == c for c, p in enumerate(pairs, 1))
    with pytest.raises(ValueError, match="valid"):
        shape_slots.code_of("hexagon", "red")
    with pytest.raises(ValueError, match=r"\[0, 201\)"):
        shape_slots.decode_code(201)


def test_patch_codec_round_trips_and_decodes_to_detectable_scenes():
    codec = _codec()
    assert codec.image_size == (96, 96) and codec.codebook_size == 201
    ids = torch.randint(0, 201, (6, 16), generator=torch.Generator().manual_seed(0))
    images = codec.decode(ids)
    assert torch.equal(codec.encode(images), ids)
    for row, img in zip(ids, images):
        scene = shape_slots.codes_scene(row.numpy())
        # the pixel detector on the 16-cell grid finds exactly the objects the codes name
        found = {(d.shape, d.color, d.box) for d in detect(img, shape_slots.SLOT_GRID)}
        want = {(o.shape, o.color, tuple(float(x) for x in b)) for o, b in zip(scene.objects, scene.boxes(shape_slots.SLOT_CELL_PX))}
        assert found == want
        assert np.array_equal(shape_slots.scene_codes(scene), row.numpy())
    rebuilt = codec_from_config(codec.config())
    assert torch.equal(rebuilt.patches, codec.patches) and rebuilt.grid == codec.grid


def test_patch_codec_rejects_bad_patches():
    with pytest.raises(ValueError, match="distinct"):
        PatchCodec(np.zeros((3, 4, 4, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"\[K, p, p, 3\]"):
        PatchCodec(np.zeros((3, 4, 5, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"\[0, 201\)"):
        _codec().decode(torch.full((1, 16), 201))


def test_slot_scenes_satisfy_their_records_and_sit_on_slot_corners():
    from mmrl.data.tasks import load_task

    rng = np.random.default_rng(0)
    for row in load_task("shapes").train[::7]:
        codes = shape_slots.slot_codes_for_metadata(row["metadata"], rng)
        scene = shape_slots.codes_scene(codes)
        assert all(o.row % 4 == 0 and o.col % 4 == 0 for o in scene.objects)
        assert _judge(scene, row["metadata"]), row["prompt"]


def test_infer_grid_tells_the_two_layouts_apart():
    twelve = Scene([SceneObject("square", "red", 0, 0), SceneObject("circle", "blue", 6, 6)], GRID).render(8)
    assert infer_grid(twelve) == 12
    codes = np.zeros(16, dtype=np.int64)
    codes[[0, 5]] = [shape_slots.code_of("square", "red"), shape_slots.code_of("circle", "blue")]
    sixteen = _codec().decode(torch.as_tensor(codes)[None])[0]
    assert infer_grid(sixteen) == 16
    # the GenEval reward with its default detector scores both layouts correctly
    from mmrl.rewards.geneval import GenEvalCorrect

    record = {"tag": "two_object", "include": [{"class": "square", "count": 1}, {"class": "circle", "count": 1}],
              "prompt": "a photo of a square and a circle"}
    out = GenEvalCorrect()(["p", "p"], [twelve, sixteen], metadata=[record, record])
    assert [o["score"] for o in out] == [1.0, 1.0]
    assert infer_grid(twelve.resize((50, 50))) == GRID  # not exactly rendered: the default grid


# ------------------------------------------------------------------ caption noise


def _records():
    return {
        "single_object": {"tag": "single_object", "include": [{"class": "square", "count": 1}], "prompt": "a photo of a square"},
        "counting": {"tag": "counting", "include": [{"class": "circle", "count": 4}], "exclude": [{"class": "circle", "count": 5}],
                     "prompt": "a photo of four circles"},
        "colors": {"tag": "colors", "include": [{"class": "square", "count": 1, "color": "red"}], "prompt": "a photo of a red square"},
        "position": {"tag": "position", "include": [{"class": "circle", "count": 1},
                                                    {"class": "square", "count": 1, "position": ["left of", 0]}],
                     "prompt": "a photo of a square left of a circle"},
        "color_attr": {"tag": "color_attr", "include": [{"class": "square", "count": 1, "color": "red"},
                                                        {"class": "circle", "count": 1, "color": "blue"}],
                       "prompt": "a photo of a red square and a blue circle"},
    }


def test_caption_noise_makes_the_specific_error_of_each_task():
    rng = np.random.default_rng(0)
    recs = _records()
    c = caption_noise.corrupt(recs["counting"], rng, SHAPE_NAMES, COLORS, max_count=4)
    assert c["include"][0]["count"] == 3 and c["exclude"] == [{"class": "circle", "count": 4}]  # 4 + 1 would exceed 4
    assert caption_noise.corrupt(recs["position"], rng, SHAPE_NAMES, COLORS, 4)["include"][1]["position"] == ["right of", 0]
    swapped = caption_noise.corrupt(recs["color_attr"], rng, SHAPE_NAMES, COLORS, 4)["include"]
    assert [x["color"] for x in swapped] == ["blue", "red"]
    assert caption_noise.corrupt(recs["colors"], rng, SHAPE_NAMES, COLORS, 4)["include"][0]["color"] != "red"
    assert caption_noise.corrupt(recs["single_object"], rng, SHAPE_NAMES, COLORS, 4)["include"][0]["class"] != "square"
    assert recs == _records()  # the input is never modified
    with pytest.raises(ValueError, match="valid"):
        caption_noise.corrupt({**recs["colors"], "tag": "other"}, rng, SHAPE_NAMES, COLORS, 4)


def test_a_scene_drawn_for_a_corrupted_caption_fails_the_caption():
    rng = np.random.default_rng(1)
    for record in _records().values():
        for _ in range(5):
            wrong = caption_noise.corrupt(record, rng, SHAPE_NAMES, COLORS, 4)
            scene = shape_slots.codes_scene(shape_slots.slot_codes_for_metadata(wrong, rng))
            assert not _judge(scene, record), (record["prompt"], wrong)


# ------------------------------------------------------------------ word tokenizer


def test_word_tokenizer_one_token_per_word_and_reloads(tmp_path):
    from transformers import AutoTokenizer

    from mmrl.models.tokenizers import word_tokenizer, words_of

    tok = word_tokenizer(words_of(["a photo of a red square:", "two circles"]), ["<|User|>"])
    ids = tok("<|User|>: a photo of two squares")["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["<|User|>", ":", "a", "photo", "of", "two", "<unk>"]
    tok.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path)("a red circles")["input_ids"] == tok("a red circles")["input_ids"]
    with pytest.raises(ValueError, match="whitespace"):
        word_tokenizer(["two words"])


# ------------------------------------------------------------------ the tiny Janus with 2-D image positions


def _janus(positions: bool, seed: int = 0):
    from mmrl.models.janus import JanusAdapter

    return JanusAdapter.tiny(seed=seed, codec=_codec(), hidden_size=32, num_layers=1, num_heads=2, cfg_scale=1.0,
                             vocabulary=["a photo of a red square", "two circles"], image_positions_2d=positions)


def test_zero_position_embeddings_change_nothing_and_trained_ones_do():
    from mmrl.models.image_positions import ATTRIBUTE

    plain, with_pos = _janus(False), _janus(True)
    assert not hasattr(plain.unwrapped_core, ATTRIBUTE)
    gen = dict(seeds=[1, 2, 3, 4])
    a = plain.sample(["a photo of a red square", "two circles"], 2, **gen)
    b = with_pos.sample(["a photo of a red square", "two circles"], 2, **gen)
    assert torch.equal(a.response_ids, b.response_ids) and torch.allclose(a.old_logp, b.old_logp)
    pos = getattr(with_pos.unwrapped_core, ATTRIBUTE)
    torch.nn.init.normal_(pos.row, std=2.0)
    torch.nn.init.normal_(pos.col, std=2.0)
    c = with_pos.sample(["a photo of a red square", "two circles"], 2, **gen)
    assert not torch.allclose(c.old_logp, a.old_logp)
    # teacher-forced scoring sees the same positions as the sampler: ratio 1
    assert torch.allclose(with_pos.logprob(c).logp, c.old_logp, atol=1e-5)


def test_position_embeddings_are_saved_beside_the_transformers_weights(tmp_path):
    from safetensors.torch import load_file

    from mmrl.checkpointing.checkpoint import load_model_weights
    from mmrl.models.image_positions import ATTRIBUTE, FILE
    from mmrl.models.janus import JanusAdapter

    policy = _janus(True)
    pos = getattr(policy.unwrapped_core, ATTRIBUTE)
    torch.nn.init.normal_(pos.row)
    policy.save_pretrained(tmp_path)
    assert not any(k.startswith(ATTRIBUTE) for k in load_file(tmp_path / "model.safetensors"))
    assert (tmp_path / FILE).is_file()
    again = JanusAdapter.from_pretrained(tmp_path)
    assert torch.equal(getattr(again.unwrapped_core, ATTRIBUTE).row, pos.row)
    other = _janus(True, seed=3)  # the trainer's resume path: every *.safetensors of the directory
    load_model_weights(other.unwrapped, tmp_path)
    assert torch.equal(getattr(other.unwrapped_core, ATTRIBUTE).row, pos.row)
    plain_dir = tmp_path / "plain"
    _janus(False).save_pretrained(plain_dir)
    assert not (plain_dir / FILE).exists()


def test_janus_sft_balances_groups_and_applies_caption_noise():
    from mmrl.tiny_world.pretrain import janus_sft

    policy = _janus(True)
    recs = _records()
    prompts = [recs["colors"]["prompt"]] * 9 + [recs["counting"]["prompt"]]
    metadata = [recs["colors"]] * 9 + [recs["counting"]]
    seen: list[dict] = []

    def draw(record, rng):
        seen.append(record)
        return shape_slots.slot_codes_for_metadata(record, rng)

    janus_sft(policy, prompts, metadata, steps=4, batch_size=50, progress=False, draw_tokens=draw,
              groups=["colors"] * 9 + ["counting"], caption_noise=0.5,
              corrupt=lambda r, rng: caption_noise.corrupt(r, rng, SHAPE_NAMES, COLORS, 4))
    counting = [r for r in seen if r["tag"] == "counting"]
    assert 0.3 < len(counting) / len(seen) < 0.7  # one prompt of ten, drawn as often as the other nine together
    wrong = sum(r["include"][0]["count"] != 4 for r in counting)
    assert 0.25 < wrong / len(counting) < 0.75
    with pytest.raises(ValueError, match="caption_noise"):
        janus_sft(policy, prompts, metadata, steps=1, caption_noise=1.5, progress=False)


# ------------------------------------------------------------------ evaluation and presets


def test_balanced_rows_and_per_task_accuracy_by_hand():
    from mmrl.tiny_world.shapes_eval import balanced_rows, per_task_accuracy

    rows = [{"prompt": "a", "metadata": {"tag": "colors"}}, {"prompt": "b", "metadata": {"tag": "colors"}},
            {"prompt": "c", "metadata": {"tag": "counting"}}]
    out = balanced_rows(rows, 3)
    assert [r["prompt"] for r in out] == ["c", "c", "c", "a", "b", "a"]  # GenEval's task order, prompts cycled
    acc = per_task_accuracy(out, [1, 0, 0, 1, 1, 0])
    assert acc == {"counting": 1 / 3, "colors": 2 / 3, "overall": 0.5}


@pytest.mark.parametrize("arm", ["GRPO", "GCPO"])
def test_presets_match_the_replicate_recipe(arm):
    from mmrl.tiny_world.shapes_rl import ARMS, SHAPES_RL

    preset = yaml.safe_load((ROOT / "configs" / f"tiny_{arm.lower()}_shapes.yaml").read_text())
    preset.pop("output_dir")
    assert preset == {**SHAPES_RL, **ARMS[arm]}
