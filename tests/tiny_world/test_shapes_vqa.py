"""The tiny VLM world: the `shapes_vqa` task (split, answers, reward), its base model's pre-training, the GRPO/GCPO
presets and their negative condition, and `run_gcpo_vs_grpo_vqa` end to end at smoke size."""
from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from mmrl.tiny_world.shapes import CLASSIC_COLORS as COLORS, CLASSIC_SHAPES as SHAPE_NAMES, Scene, SceneObject, detect
from mmrl.data.tasks import load_task
from mmrl.tiny_world import shapes_vqa as sv

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def task():
    return load_task("shapes_vqa")


def image_bytes(row) -> bytes:
    return np.asarray(row["prompt"]["images"][0]).tobytes()


# ------------------------------------------------------------------------------------------------------ task


def test_split_is_leak_free_and_covers_every_question_type(task):
    train_images = {image_bytes(r) for r in task.train}
    test_images = {image_bytes(r) for r in task.test}
    assert not train_images & test_images  # no test image is seen in training, under any question
    val_images = {image_bytes(r) for r in task.validation}
    assert val_images and not val_images & (train_images | test_images)  # validation: its own scenes
    for split in (task.train, task.test, task.validation):
        assert {r["qtype"] for r in split} == set(sv.QUESTION_TYPES)
        assert all(r["answer"] in sv.ANSWER_WORDS for r in split)
    assert task.family == "vlm" and task.metric == "shapes_vqa" and task.reward_funcs == ["shapes_vqa"]
    assert task.info["test_rows"] == len(task.test) > 500


def test_answers_of_a_hand_built_scene():
    # red circle at column 0, blue square at column 6, red triangle at column 6 lower down
    scene = Scene([SceneObject("circle", "red", 0, 0), SceneObject("square", "blue", 0, 6), SceneObject("triangle", "red", 6, 6)])
    qa = sv.scene_questions(scene)
    assert dict(qa["count"]) == {"how many squares?": "1", "how many circles?": "1", "how many triangles?": "1"}
    assert dict(qa["colour"]) == {"colour of the square?": "blue", "colour of the circle?": "red", "colour of the triangle?": "red"}
    assert dict(qa["shape"]) == {"shape of the blue one?": "square"}  # red is on two objects: no question
    pos = dict(qa["position"])
    assert pos["red circle left or right of blue square?"] == "left"
    assert pos["blue square left or right of red circle?"] == "right"
    assert "blue square left or right of red triangle?" not in pos  # same column: no left/right question


def test_column_questions_of_a_hand_built_scene_and_their_rows():
    scene = Scene([SceneObject("circle", "red", 0, 0), SceneObject("square", "blue", 0, 6), SceneObject("triangle", "red", 6, 7)])
    assert sv.auxiliary_questions(scene, "column") == [("column of the blue one?", "6")]  # red is on two objects
    assert sv.auxiliary_questions(scene, "column_named") == [
        ("column of the red circle?", "0"), ("column of the blue square?", "6"), ("column of the red triangle?", "7")]
    assert sv.auxiliary_questions(scene, "side") == [("side of the blue one?", "right")]  # cells 6-8 of 0-11
    assert sv.auxiliary_questions(scene, "side_one") == []  # three objects
    alone = Scene([SceneObject("circle", "red", 3, 4)])  # cells 4-6: its centre, 5, left of the middle line 6
    assert sv.auxiliary_questions(alone, "side_one") == sv.auxiliary_questions(alone, "side") == [("side of the red one?", "left")]
    with pytest.raises(ValueError, match="must be one of .*'column'.*got 'row'"):
        sv.auxiliary_questions(scene, "row")
    rows = sv.auxiliary_rows("column", "train")
    assert 0 < len(rows) <= len(sv.split_scenes()["train"])
    from mmrl.tiny_world.shapes import image_to_cells
    from mmrl.tiny_world.shapes import color_index

    for r in rows[:50]:  # the answer is the named colour's leftmost cell, read back off the rendered image
        colour = r["prompt"]["prompt"].removeprefix("column of the ").removesuffix(" one?")
        cells = image_to_cells(r["prompt"]["images"][0])  # [12, 12]
        cols = np.nonzero((cells == color_index(colour)).any(axis=0))[0]
        assert r["answer"] == str(cols.min()) and cols.max() - cols.min() == 2 and r["qtype"] == "column"
    assert {r["answer"] for r in rows} == {str(c) for c in range(10)}
    assert rows == sv.auxiliary_rows("column", "train")  # drawn with a fixed seed
    with pytest.raises(ValueError, match="train and validation splits, got 'test'"):
        sv.auxiliary_rows("column", "test")


def test_one_object_side_rows_read_back_off_the_image_and_never_show_a_held_out_scene():
    rows = sv.auxiliary_rows("side_one", "train")
    assert len(rows) == len(sv.one_object_scenes()) > 0.9 * sv.ONE_OBJECT_SCENES
    held = {image_bytes(r) for split in ("validation", "test") for r in getattr(load_task("shapes_vqa"), split)}
    assert not held & {image_bytes(r) for r in rows}
    for r in rows[:100]:
        (d,) = detect(r["prompt"]["images"][0])
        assert r["prompt"]["prompt"] == f"side of the {d.color} one?"
        left, right = d.box[0], d.box[2]  # pixel columns of the object's box, on a 48-pixel image
        assert r["answer"] == ("left" if left + right < sv.IMAGE_PX else "right")
    assert {r["answer"] for r in rows} == {"left", "right"}
    val = sv.auxiliary_rows("side_one", "validation")
    assert val and all(r["scene"].startswith("validation-") for r in val)
    from mmrl.tiny_world import models

    data = models._vqa_data(models.TINY_MODELS["shapes-vqa-qwen3-side50"])  # a curriculum naming auxiliary types
    assert data["phases"] == [(["side_one"], 1000), (["side_one", "side"], 1000)]
    assert data["groups"].count("side_one") == len(rows) and data["groups"].count("side") == len(sv.auxiliary_rows("side", "train"))
    with pytest.raises(ValueError, match=r"curriculum types .* must be among .*got \['row'\]"):
        models._vqa_data(dataclasses.replace(models.TINY_MODELS["shapes-vqa-qwen3-side50"], data={"phases": [[["row"], 10]]}))


def test_every_question_rows_hold_every_ordered_pair_read_back_off_the_image():
    rows = sv.every_question_rows("position", "train")
    scenes = sv.split_scenes()["train"]
    by_scene: dict[str, list[dict]] = {}
    for r in rows:
        by_scene.setdefault(r["scene"], []).append(r)
    for sid, group in list(by_scene.items())[:40]:  # each scene: every ordered pair of unique objects MIN_DX apart
        found = detect(group[0]["prompt"]["images"][0])
        unique = [d for d in found if sum(e.color == d.color and e.shape == d.shape for e in found) == 1]
        expected = {(f"{a.color} {a.shape} left or right of {b.color} {b.shape}?", "left" if a.box[0] < b.box[0] else "right")
                    for a in unique for b in unique if a is not b and abs(a.box[0] - b.box[0]) >= sv.MIN_DX * sv.CELL_PX}
        assert {(r["prompt"]["prompt"], r["answer"]) for r in group} == expected and len(group) == len(expected)
    assert {r["qtype"] for r in rows} == {"position"} and all(r["scene"].startswith("train-") for r in rows)
    assert len(rows) > 2 * sum(r["qtype"] == "position" for r in load_task("shapes_vqa").train)  # more than the task's one per scene
    task_pairs = {(r["scene"], r["prompt"]["prompt"]) for r in load_task("shapes_vqa").train if r["qtype"] == "position"}
    assert task_pairs <= {(r["scene"], r["prompt"]["prompt"]) for r in rows}  # the task's question is one of them
    assert len(scenes) >= len(by_scene)
    with pytest.raises(ValueError, match="question type must be one of .*got 'column'"):
        sv.every_question_rows("column", "train")
    with pytest.raises(ValueError, match="train or validation split, got 'test'"):
        sv.every_question_rows("position", "test")


def test_word_tokens_give_one_token_per_word_and_no_unknown_word():
    from mmrl.models.vlm import VLMAdapter

    words = sv.vocabulary()
    assert len(words) == len(set(words))
    tok = VLMAdapter.tiny_processor(min_pixels=48 * 48, max_pixels=48 * 48, model_type="qwen3_vl", words=words).tokenizer
    texts = [r["prompt"]["prompt"] + " " + r["answer"] for split in ("train", "validation", "test")
             for r in getattr(load_task("shapes_vqa"), split)]
    texts += [r["prompt"]["prompt"] + " " + r["answer"] for t in sv.WORD_AUX_TYPES for r in sv.auxiliary_rows(t, "validation")]
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids, text
    ids = tok("red circle left or right of blue square?", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids) == ["red", "circle", "left", "or", "right", "of", "blue", "square", "?"]
    assert tok.decode(tok("left", add_special_tokens=False)["input_ids"] + [tok.eos_token_id], skip_special_tokens=True) == "left"
    chat = tok.apply_chat_template([{"role": "user", "content": "shape of the red one?"}], tokenize=False, add_generation_prompt=True)
    assert tok.convert_ids_to_tokens(tok(chat, add_special_tokens=False)["input_ids"]) == [
        "<|", "user", "|>", "shape", "of", "the", "red", "one", "?", "<|", "assistant", "|>"]


def test_a_word_token_base_builds_saves_and_answers(tmp_path):
    from mmrl.models.vlm import VLMAdapter
    from mmrl.tiny_world import models

    spec = dataclasses.replace(models.TINY_MODELS["shapes-vqa-qwen3-words50"], steps=2)
    policy = models.build_untrained(spec)
    assert policy.model.config.text_config.vocab_size == len(policy.tokenizer)
    row = next(r for r in load_task("shapes_vqa").validation if r["qtype"] == "position")
    policy.save_pretrained(tmp_path / "m")
    again = VLMAdapter.from_pretrained(tmp_path / "m")
    assert again.encode_prompts([row["prompt"]])[0] == policy.encode_prompts([row["prompt"]])[0]
    prompt_ids = again.encode_prompts([row["prompt"]])[0][0]
    assert len(prompt_ids) == 3 + 1 + 36 + 1 + 9 + 3  # role marker, vision start, 36 image tokens, vision end, 9 words, assistant
    with pytest.raises(ValueError, match="word_tokens needs the shapes_vqa task's vocabulary, not task 'countdown3'"):
        models.build_untrained(dataclasses.replace(spec, task="countdown3"))
    with pytest.raises(ValueError, match=r"every_types must be among .*got \['column'\]"):
        models._vqa_rows(dataclasses.replace(spec, data={"every_types": ["column"]}))
    pairs = models.TINY_MODELS["shapes-vqa-qwen3-words50-pairs"]
    targets = models._training_pairs(pairs)[1]
    every = sv.every_question_rows("position", "train")
    assert targets[-len(every):] == [r["answer"] for r in every]
    assert len(targets) == len(load_task("shapes_vqa").train) + len(sv.auxiliary_rows("column_named", "train")) + len(every)


def test_every_type_mix_asks_each_training_scene_every_count_question():
    """`-side50-every`'s mix: every question of all four types; count is asked of every shape name in every scene,
    so its count rows are the task's one per training scene plus (shape names) x (training scenes), with the answers
    the scene's objects give."""
    from mmrl.tiny_world import models

    rows = models._vqa_rows(models.TINY_MODELS["shapes-vqa-qwen3-side50-every"])
    scenes = sv.split_scenes()["train"]
    count = [r for r in rows if r["qtype"] == "count" and r.get("scene", "").startswith("train-")]
    assert len(count) == len(scenes) + len(SHAPE_NAMES) * len(scenes)
    i = 17
    mine = {r["prompt"]["prompt"]: r["answer"] for r in count if r["scene"] == f"train-{i}"}
    assert mine == {f"how many {s}s?": str(sum(o.shape == s for o in scenes[i].objects)) for s in SHAPE_NAMES}
    assert {r["qtype"] for r in rows} == set(sv.QUESTION_TYPES) | {"side", "side_one"}


def test_answers_agree_with_the_exact_detector_on_rendered_images(task):
    """Every answer recomputed from what the shapes detector finds in the image itself."""
    for r in task.test[:150]:
        found = detect(r["prompt"]["images"][0])
        q, a = r["prompt"]["prompt"], r["answer"]
        if r["qtype"] == "count":
            shape = next(s for s in SHAPE_NAMES if f"{s}s?" in q)
            assert a == str(sum(d.shape == shape for d in found))
        elif r["qtype"] == "colour":
            (d,) = [d for d in found if f"the {d.shape}?" in q]
            assert a == d.color
        elif r["qtype"] == "shape":
            (d,) = [d for d in found if f"the {d.color} one?" in q]
            assert a == d.shape
        else:
            first, second = q.removesuffix("?").split(" left or right of ")
            (d1,) = [d for d in found if f"{d.color} {d.shape}" == first]
            (d2,) = [d for d in found if f"{d.color} {d.shape}" == second]
            assert a == ("left" if d1.box[0] < d2.box[0] else "right")


def test_reward_is_normalised_exact_match():
    got = sv.shapes_vqa(None, ["Red.", "  red ", "blue", "re d", "reddish", [{"role": "assistant", "content": "LEFT!"}]],
                        ["red", "red", "red", "red", "red", "left"])
    assert got == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]


def test_wrong_answer_is_wrong_and_of_the_same_type():
    rng = random.Random(0)
    for answer, qtype, pool in [("2", "count", [str(k) for k in range(5)]), ("red", "colour", COLORS),
                                ("circle", "shape", SHAPE_NAMES), ("left", "position", ["left", "right"])]:
        seen = {sv.wrong_answer(answer, qtype, rng) for _ in range(60)}
        assert seen == set(pool) - {answer}


# ------------------------------------------------------------------------------------------------ base model


def test_vlm_sft_learns_answers_about_images(task):
    """The pre-training loop on the real class: the answer loss of a few image questions falls, and every step is
    deterministic for its seed."""
    from mmrl.models.vlm import VLMAdapter
    from mmrl.tiny_world.vlm_pretrain import vlm_sft

    policy = VLMAdapter.tiny(seed=0, min_pixels=sv.IMAGE_PX ** 2, max_pixels=sv.IMAGE_PX ** 2, max_new_tokens=10)
    rows = [task.train[i] for i in (0, 1, 2, 3)]
    answers = [r["answer"] for r in rows]
    history = vlm_sft(policy, [r["prompt"] for r in rows], answers, steps=12, batch_size=4, lr=1e-2, progress=False)
    assert history[-1]["loss"] < 0.6 * history[0]["loss"]  # 4.66 -> 2.46 (deterministic)
    again = VLMAdapter.tiny(seed=0, min_pixels=sv.IMAGE_PX ** 2, max_pixels=sv.IMAGE_PX ** 2, max_new_tokens=10)
    history2 = vlm_sft(again, [r["prompt"] for r in rows], answers, steps=1, batch_size=4, lr=1e-2, progress=False)
    assert history2[0]["loss"] == history[0]["loss"]


def test_vlm_sft_curriculum_draws_only_the_first_groups_for_the_first_steps(task):
    """`first_steps` steps on rows of `first_groups` only, then every row; the images reach the model in both."""
    from mmrl.models.vlm import VLMAdapter
    from mmrl.tiny_world.vlm_pretrain import vlm_sft

    policy = VLMAdapter.tiny(seed=0, min_pixels=sv.IMAGE_PX ** 2, max_pixels=sv.IMAGE_PX ** 2, max_new_tokens=10)
    rows = task.train[:24]
    seen: list[list[str]] = []
    encode = policy.encode_prompts

    def spy(prompts):
        seen.append([p["prompt"] for p in prompts])
        return encode(prompts)

    policy.encode_prompts = spy
    groups = [r["qtype"] for r in rows]
    vlm_sft(policy, [r["prompt"] for r in rows], [r["answer"] for r in rows], steps=4, batch_size=4, groups=groups,
            first_groups=["colour"], first_steps=2, progress=False)
    qtype_of = {r["prompt"]["prompt"]: r["qtype"] for r in rows}
    assert len(seen) == 4 and all(qtype_of[q] == "colour" for step in seen[:2] for q in step)
    assert {qtype_of[q] for step in seen[2:] for q in step} - {"colour"}  # then the other types too
    with pytest.raises(ValueError, match="first_steps"):
        vlm_sft(policy, ["q"], ["a"], steps=2, first_steps=3, groups=["x"], first_groups=["x"])
    with pytest.raises(ValueError, match="first_groups"):
        vlm_sft(policy, ["q"], ["a"], steps=2, first_steps=1, groups=["x"], first_groups=["colour"])


def _drawn_rows(policy, prompts):
    """Spy on `policy.encode_prompts`: the list it fills with each step's row indices (prompt objects are the caller's)."""
    where = {id(p): i for i, p in enumerate(prompts)}
    seen: list[list[int]] = []
    encode = policy.encode_prompts

    def spy(batch):
        seen.append([where[id(p)] for p in batch])
        return encode(batch)

    policy.encode_prompts = spy
    return seen


def _tiny_vlm():
    from mmrl.models.vlm import VLMAdapter

    return VLMAdapter.tiny(seed=0, min_pixels=sv.IMAGE_PX ** 2, max_pixels=sv.IMAGE_PX ** 2, max_new_tokens=10)


def _old_first_phase_order(n, first_idx, first_steps, steps, batch_size, seed):
    """The row indices per step of `vlm_sft` before phases existed (its first_groups / first_steps draw, verbatim)."""
    g = torch.Generator().manual_seed(seed)
    first_idx = torch.tensor(first_idx, dtype=torch.long)
    pool = first_idx
    order, cursor = pool[torch.randperm(len(pool), generator=g)], 0
    out = []
    for step in range(1, steps + 1):
        if first_steps and step == first_steps + 1:
            pool = torch.arange(n)
            order, cursor = pool[torch.randperm(n, generator=g)], 0
        if cursor + batch_size > len(pool):
            order, cursor = pool[torch.randperm(len(pool), generator=g)], 0
        out.append(order[cursor : cursor + batch_size].tolist())
        cursor += batch_size
    return out


def test_vlm_sft_phases_draw_only_each_phase_s_types_then_the_mix(task):
    """A curriculum of phases: every row drawn in a phase's steps is of that phase's types; after the phases every
    type comes back; and the label noise starts only after `clean_steps`."""
    from mmrl.tiny_world.vlm_pretrain import vlm_sft

    rows = task.train[:40]
    prompts = [r["prompt"] for r in rows]
    qtypes = [r["qtype"] for r in rows]
    policy = _tiny_vlm()
    seen = _drawn_rows(policy, prompts)
    corrupted_at: list[int] = []

    def corrupt(i, rng):
        corrupted_at.append(len(seen) + 1)  # called before the step's encode_prompts: this is that step's number
        return sv.wrong_answer(rows[i]["answer"], rows[i]["qtype"], rng)

    phases = [(["colour"], 2), (["shape", "count"], 2), (["position"], 1)]
    vlm_sft(policy, prompts, [r["answer"] for r in rows], steps=8, batch_size=4, groups=qtypes, phases=phases,
            label_noise=0.9, corrupt=corrupt, clean_steps=5, progress=False)
    assert len(seen) == 8
    assert {qtypes[i] for step in seen[:2] for i in step} == {"colour"}
    assert {qtypes[i] for step in seen[2:4] for i in step} <= {"shape", "count"}
    assert {qtypes[i] for i in seen[4]} == {"position"}
    assert len({qtypes[i] for step in seen[5:] for i in step}) > 1  # the mix
    assert corrupted_at and min(corrupted_at) == 6  # clean labels through step 5, noise (0.9) from step 6 on


def test_vlm_sft_first_groups_and_its_one_phase_form_draw_the_old_batches_bit_for_bit(task):
    """`first_groups` / `first_steps` draws exactly the rows the code before phases drew (a verbatim copy of its
    loop), and `phases=[(first_groups, first_steps)]` the same rows with the same losses."""
    from mmrl.tiny_world.vlm_pretrain import vlm_sft

    rows = task.train[:30]
    prompts, answers, qtypes = [r["prompt"] for r in rows], [r["answer"] for r in rows], [r["qtype"] for r in rows]
    kw = dict(steps=6, batch_size=4, seed=3, groups=qtypes, progress=False, label_noise=0.3,
              corrupt=lambda i, rng: sv.wrong_answer(rows[i]["answer"], rows[i]["qtype"], rng))
    a = _tiny_vlm()
    seen_a = _drawn_rows(a, prompts)
    hist_a = vlm_sft(a, prompts, answers, first_groups=["colour"], first_steps=3, **kw)
    colour = [i for i, t in enumerate(qtypes) if t == "colour"]
    assert seen_a == _old_first_phase_order(len(rows), colour, 3, 6, 4, 3)
    b = _tiny_vlm()
    seen_b = _drawn_rows(b, prompts)
    hist_b = vlm_sft(b, prompts, answers, phases=[(["colour"], 3)], **kw)
    assert seen_b == seen_a and [h["loss"] for h in hist_b] == [h["loss"] for h in hist_a]
    plain = _tiny_vlm()
    seen_plain = _drawn_rows(plain, prompts)
    vlm_sft(plain, prompts, answers, steps=3, batch_size=4, seed=3, progress=False)
    assert seen_plain == _old_first_phase_order(len(rows), list(range(len(rows))), 0, 3, 4, 3)  # no curriculum


def test_vlm_sft_rejects_bad_phases():
    from mmrl.tiny_world.vlm_pretrain import vlm_sft

    with pytest.raises(ValueError, match="more than steps=2"):
        vlm_sft(None, ["q", "r"], ["a", "b"], steps=2, groups=["x", "y"], phases=[(["x"], 2), (["y"], 1)])
    with pytest.raises(ValueError, match="curriculum phase 1 needs groups and steps >= 1"):
        vlm_sft(None, ["q", "r"], ["a", "b"], steps=2, groups=["x", "y"], phases=[(["x"], 1), (["y"], 0)])
    with pytest.raises(ValueError, match="not both"):
        vlm_sft(None, ["q"], ["a"], steps=2, groups=["x"], phases=[(["x"], 1)], first_groups=["x"], first_steps=1)
    with pytest.raises(ValueError, match="clean_steps must lie in"):
        vlm_sft(None, ["q"], ["a"], steps=2, clean_steps=3)


def test_vqa_data_keeps_the_old_keys_and_reads_phases(monkeypatch):
    from mmrl.tiny_world import models

    old = models._vqa_data(models.TINY_MODELS["shapes-vqa"])
    assert old["first_groups"] == ["colour"] and old["first_steps"] == 200 and "phases" not in old
    assert "clean_steps" not in old and old["label_noise"] == 0.3
    reads = models.TINY_MODELS["shapes-vqa-reads"]
    new = models._vqa_data(reads)
    assert new["phases"] == [(types, k) for types, k in models.SHAPES_VQA_PHASES] and new["clean_steps"] == 800
    assert sum(k for _, k in new["phases"]) <= reads.steps
    with pytest.raises(ValueError, match=r"must be among .*got \['size'\]"):
        models._vqa_data(dataclasses.replace(reads, data={"phases": [[["size"], 5]]}))
    with pytest.raises(ValueError, match="not both"):
        models._vqa_data(dataclasses.replace(reads, data={"phases": [[["colour"], 5]], "first_types": ["colour"],
                                                          "first_steps": 5}))
    smoke = models.smoke_spec("shapes-vqa-reads", 20)  # the phases shrink into the smoke base's steps
    assert smoke.data["phases"] == [[["colour"], 20]] and smoke.data["clean_steps"] == 20
    assert models.spec_for("shapes-vqa").key() == "cd30d55ccb"  # the committed base (REFERENCE_BUILDS) keeps its key


def test_vqa_rows_add_the_auxiliary_questions_and_the_position_table_scale_applies(monkeypatch):
    from mmrl.tiny_world import models
    from mmrl.tiny_world.vqa_rl import per_type_accuracy

    col = models.TINY_MODELS["shapes-vqa-qwen3-col"]
    task_rows, aux = load_task("shapes_vqa").train, sv.auxiliary_rows("column", "train")
    prompts, targets = models._training_pairs(col)
    assert targets == [r["answer"] for r in task_rows] + [r["answer"] for r in aux]
    assert models._training_pairs(models.TINY_MODELS["shapes-vqa-qwen3"])[1] == [r["answer"] for r in task_rows]
    with pytest.raises(ValueError, match=r"aux_types must be among \('column', .*\), got \['row'\]"):
        models._vqa_rows(dataclasses.replace(col, data={"aux_types": ["row"]}))
    noisy = models._vqa_data(dataclasses.replace(col, data={"aux_types": ["column"], "label_noise": 0.5}))
    i = len(task_rows)  # the first auxiliary row: its wrong answer is another column
    wrong = noisy["corrupt"](i, random.Random(0))
    assert wrong != aux[0]["answer"] and wrong in {str(c) for c in range(10)}
    scaled = models.build_untrained(models.TINY_MODELS["shapes-vqa-qwen3-col50"]).model.model.visual.pos_embed.weight
    plain = models.build_untrained(col).model.model.visual.pos_embed.weight
    torch.testing.assert_close(scaled, 50.0 * plain)  # same seed, same draw, times the scale
    qwen25 = dataclasses.replace(models.TINY_MODELS["shapes-vqa-reads-deep"],
                                 arch={**models.TINY_MODELS["shapes-vqa-reads-deep"].arch, "position_table_scale": 2.0})
    with pytest.raises(ValueError, match="position_table_scale / position_table_init need a vision tower with an absolute position table"):
        models.build_untrained(qwen25)
    rows = [{"qtype": "column"}, {"qtype": "colour"}, {"qtype": "column"}]
    assert per_type_accuracy(rows, [1, 0, 0]) == {"colour": 0.0, "column": 0.5, "overall": pytest.approx(1 / 3)}


def test_majority_answers_and_base_reading_by_hand():
    from mmrl.tiny_world.vqa_rl import base_reading, majority_answers

    train = [{"qtype": "colour", "answer": a} for a in ("red", "red", "blue")] + [
        {"qtype": "position", "answer": a} for a in ("left", "right")]
    assert majority_answers(train) == {"colour": "red", "position": "left"}  # a tie goes to the first in text order
    rows = [{"qtype": "colour", "answer": a} for a in ("red", "blue", "green", "blue")] + [{"qtype": "position", "answer": "right"}]
    got = base_reading(rows, [0, 1, 1, 1, 0], majority_answers(train))
    assert got["colour"]["accuracy"]["estimate"] == 0.75 and got["colour"]["majority"] == 0.25
    assert got["colour"]["chance"] == pytest.approx(1 / 7) and got["colour"]["rows"] == 4
    assert got["colour"]["minus_majority"]["estimate"] == pytest.approx(0.5)
    assert got["position"]["majority"] == 0.0 and got["overall"]["accuracy"]["estimate"] == pytest.approx(0.6)


def test_vlm_sft_rejects_bad_noise():
    from mmrl.tiny_world.vlm_pretrain import vlm_sft

    with pytest.raises(ValueError, match="label_noise"):
        vlm_sft(None, ["q"], ["a"], steps=1, label_noise=1.5)
    with pytest.raises(ValueError, match="corrupt="):
        vlm_sft(None, ["q"], ["a"], steps=1, label_noise=0.3)


def test_base_builds_from_a_smaller_spec(tmp_path, monkeypatch):
    from mmrl.tiny_world import models

    monkeypatch.setenv("MMRL_CACHE", str(tmp_path))
    small = dataclasses.replace(models.TINY_MODELS["shapes-vqa"], steps=2, batch_size=8,
                                data={**models.TINY_MODELS["shapes-vqa"].data, "first_steps": 1})
    monkeypatch.setitem(models.TINY_MODELS, "shapes-vqa", small)
    path = models.ensure_built("shapes-vqa", progress=False)
    assert path.parent == tmp_path / "tiny_world" and (path / "tiny_spec.json").is_file()
    policy = models.load_base_policy("shapes-vqa", family="vlm")
    assert policy.family == "vlm" and policy.generation_defaults["max_new_tokens"] == small.gen_length
    ids, extras = policy.encode_prompts([load_task("shapes_vqa").test[0]["prompt"]])
    image_id = policy.image_token_id
    assert ids[0].count(image_id) == (sv.IMAGE_PX // 8) ** 2 == 36  # 48 px: 12 x 12 patches of 4 px, merged 2 x 2


# ----------------------------------------------------------------------------------------- presets and GCPO


@pytest.mark.parametrize("arm", ["GRPO", "GCPO"])
def test_presets_match_the_runner(arm):
    from mmrl.config.train_config import load_config
    from mmrl.tiny_world.vqa_rl import ARMS, VQA_RL

    path = ROOT / "configs" / f"tiny_{arm.lower()}_shapes_vqa.yaml"
    preset = yaml.safe_load(path.read_text())
    preset.pop("output_dir")
    assert preset == {**VQA_RL, **ARMS[arm]}
    load_config(path)  # valid


def test_gcpo_negative_condition_keeps_the_image_and_adds_the_wrong_answer_instruction(task):
    from mmrl.config.train_config import load_config
    from mmrl.models.vlm import VLMAdapter
    from mmrl.training.policy_factory import set_generation_defaults, generation_options

    cfg = load_config(ROOT / "configs" / "tiny_gcpo_shapes_vqa.yaml")
    policy = VLMAdapter.tiny(seed=0, min_pixels=sv.IMAGE_PX ** 2, max_pixels=sv.IMAGE_PX ** 2)
    set_generation_defaults(policy, generation_options(cfg))
    row = task.test[0]
    out = policy.sample([row["prompt"]], 2, seeds=[0, 1], max_new_tokens=3)
    pos = out.prompt_ids[0][out.prompt_mask[0]].tolist()
    neg = out.neg_prompt_ids[0][out.neg_prompt_mask[0]].tolist()
    image = policy.image_token_id
    assert neg.count(image) == pos.count(image) == 36  # the same image, 36 tokens (48 px, 4 px patches merged 2 x 2)
    text = policy.tokenizer.decode(neg)
    question = row["prompt"]["prompt"]
    assert question + "\n" + cfg.negative_instruction in text
    assert cfg.negative_instruction == "Note: Intentionally generate an incorrect answer."
    # the image inputs are the prompt's: negative and positive forwards see the same pixels
    assert torch.equal(out.extras["pixel_values"][0], policy.encode_prompts([row["prompt"]])[1]["pixel_values"][0])


# ------------------------------------------------------------------------------------------------ the runner


def test_run_gcpo_vs_grpo_vqa_smoke(tmp_path, monkeypatch, smoke_cache):
    from mmrl.tiny_world import models
    from mmrl.tiny_world.vqa_rl import NAME, run_gcpo_vs_grpo_vqa

    monkeypatch.setenv("MMRL_CACHE", str(smoke_cache))
    spec = models.TINY_MODELS["shapes-vqa"]
    monkeypatch.setitem(models.TINY_MODELS, "shapes-vqa",
                        dataclasses.replace(spec, steps=2, batch_size=8, data={**spec.data, "first_steps": 1}))
    res = run_gcpo_vs_grpo_vqa(tmp_path / "out", seeds=1, smoke=True, progress=False)
    root = tmp_path / "out" / NAME
    # --smoke runs on the smoke build of the base and never builds the full base (a real base takes up to 45 min)
    assert models.model_dir("shapes-vqa", models.SMOKE_BASE_STEPS).is_dir() and not models.model_dir("shapes-vqa").exists()
    assert json.loads((root / "base.json").read_text())["weights_sha256"] == json.loads(
        (models.model_dir("shapes-vqa", models.SMOKE_BASE_STEPS) / "tiny_spec.json").read_text())["weights_sha256"]
    saved = json.loads((root / "results.json").read_text())
    assert saved["smoke"] and saved["seeds"] == 1 and set(saved["arms"]) == {"GRPO", "GCPO", "RFT", "clean SFT"}
    assert res["base_measures"]["test"] == saved["base_measures"]["test"]
    base = saved["base_measures"]
    for key in (*sv.QUESTION_TYPES, "overall"):
        assert 0.0 <= base["test"][key] <= 1.0
        assert base["validation_pass_at_k"]["pass@1"][key] <= base["validation_pass_at_k"]["pass@8"][key]
        iv = base["validation"][key]["accuracy"]
        assert iv["low"] <= iv["estimate"] <= iv["high"]
    n = saved["test_rows"]
    assert len(base["test_items"]) == len(saved["majority_items"]) == n
    for row, runs in saved["arms"].items():  # per-question test scores, and the mean they give
        assert len(runs) == 1 and len(runs[0]["items"]) == n
        assert runs[0]["after"]["overall"] == pytest.approx(sum(runs[0]["items"]) / n)
        assert (root / "runs" / f"{row.lower().replace(' ', '-')}-seed0" / "result.json").is_file()
    assert "GCPO - GRPO" in saved["differences"] and "GRPO - RFT" in saved["differences"]
    table = (root / "table.md").read_text()
    assert "majority answer per type" in table and "clean SFT" in table and "position" in table
    for png in ("accuracy.png", "reward.png"):
        assert (root / png).read_bytes()[:4] == b"\x89PNG"
    again = run_gcpo_vs_grpo_vqa(tmp_path / "out", seeds=1, smoke=True, progress=False, report_only=True)
    assert again["differences"] == saved["differences"]  # the report rebuilt from the saved runs
    assert saved["base"] == base["model"] == "shapes-vqa" and saved["base_weights_sha256"] == base["weights_sha256"]
    with pytest.raises(ValueError, match="was scored on base shapes-vqa, not on shapes-vqa-reads"):
        run_gcpo_vs_grpo_vqa(tmp_path / "out", seeds=1, smoke=True, progress=False, report_only=True, base="shapes-vqa-reads")
    with pytest.raises(ValueError, match="seeds"):
        run_gcpo_vs_grpo_vqa(tmp_path / "bad", seeds=0)
    with pytest.raises(ValueError, match="cutoff"):
        run_gcpo_vs_grpo_vqa(tmp_path / "bad", seeds=1, cutoff="25:00")


def test_replicate_cli_cutoff_is_checked_and_only_for_the_comparisons_that_take_it():
    import argparse

    from mmrl.tiny_world import replicate

    parser = argparse.ArgumentParser()
    replicate.configure(parser)
    with pytest.raises(SystemExit, match="--cutoff applies to gcpo-vs-grpo-vqa, dmpo-vs-grpo-masked and the Sudoku comparisons only, not 'gcpo-vs-grpo'"):
        replicate.run(parser.parse_args(["gcpo-vs-grpo", "--cutoff", "15:05"]))
    with pytest.raises(SystemExit, match="cutoff must be a UTC clock time HH:MM, got '15h05'"):
        replicate.run(parser.parse_args(["gcpo-vs-grpo-vqa", "--cutoff", "15h05"]))
    with pytest.raises(SystemExit, match="only= must name rows"):
        replicate.run(parser.parse_args(["gcpo-vs-grpo-vqa", "--arm", "DAPO"]))


def test_replicate_cli_base_for_the_vqa_comparison_is_a_shapes_vqa_base(tmp_path):
    import argparse

    from mmrl.tiny_world import replicate
    from mmrl.tiny_world.vqa_rl import arm_config, check_vqa_base, vqa_bases

    assert {"shapes-vqa", "shapes-vqa-reads"} <= set(vqa_bases()) and "shapes" not in vqa_bases()
    parser = argparse.ArgumentParser()
    replicate.configure(parser)
    with pytest.raises(SystemExit, match=r"^base must be a shapes_vqa base, one of \[.*'shapes-vqa-reads'.*\], got 'shapes'$"):
        replicate.run(parser.parse_args(["gcpo-vs-grpo-vqa", "--base", "shapes", "--out", str(tmp_path)]))
    assert not (tmp_path / "gcpo-vs-grpo-vqa").exists()  # refused before anything was written
    with pytest.raises(SystemExit, match=r"--base applies to gcpo-vs-grpo, gcpo-vs-grpo-vqa, the Countdown comparisons "
                                         r".* and the Sudoku comparisons .*, not 'overfit-pool'"):
        replicate.run(parser.parse_args(["overfit-pool", "--base", "shapes-vqa-reads"]))
    assert check_vqa_base("shapes-vqa-reads") == "shapes-vqa-reads"
    import argparse

    from mmrl.tiny_world.vqa_rl import vqa_base_option

    assert vqa_base_option("shapes-vqa-reads") == "shapes-vqa-reads"  # the study scripts' --base type
    with pytest.raises(argparse.ArgumentTypeError, match=r"one of \[.*\], got 'shapes'$"):
        vqa_base_option("shapes")
    cfg = arm_config("GCPO", seed=1, out=tmp_path, base="shapes-vqa-reads")
    assert cfg["model_name_or_path"] == "tiny-world:shapes-vqa-reads" and cfg["method"] == "gcpo"
