"""Image rewards and GenEval's model-backed parts, end to end on tiny randomly initialised models built here: CLIP
score, the CLIP colour classifier, the transformers (`hf`) detector backends, and the GenEval rewards on the shapes
world. Shape and flow, not accuracy."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.tiny_world.shapes import Scene, SceneObject, scene_for_metadata
from mmrl.geneval.colors import TEMPLATES, ClipColorClassifier, object_crop
from mmrl.geneval.detectors import HFDetector, coco_label_map
from mmrl.geneval.prompts import coco_names
from mmrl.geneval.rules import Detection
from mmrl.geneval.scoring import evaluate_folder
from mmrl.rewards import REWARDS, RewardError, RewardSet
from mmrl.rewards.image_clip import ClipScore
from tiny_vision import tiny_grounding_dino_dir, tiny_mask2former_dir, tiny_open_clip_dir, tiny_owlv2_dir


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    return tiny_open_clip_dir(tmp_path_factory.mktemp("clip") / "tiny_clip")


def random_images(n, seed=0, size=(40, 50)):
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, size=(*size, 3), dtype=np.uint8)) for _ in range(n)]


def reference_clip(clip_dir):
    """The same local model loaded independently of the reward, through open_clip's own API."""
    import open_clip

    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{clip_dir}")
    return model.eval(), preprocess, open_clip.get_tokenizer(f"local-dir:{clip_dir}")


# ------------------------------------------------------------------ CLIP score


def test_clip_score_end_to_end(clip_dir):
    images = random_images(3)
    prompts = ["a photo of a dog", [{"role": "user", "content": [{"type": "text", "text": "a red cube"}]}], "x"]
    rs = RewardSet(["clip_score"], [2.0], clip_score={"model_name": f"local-dir:{clip_dir}", "batch_size": 2})
    out = rs(prompts, images)
    assert out.per_reward["clip_score"].shape == (3,) and torch.isfinite(out.total).all()
    model, preprocess, tokenizer = reference_clip(clip_dir)
    with torch.no_grad():
        img = model.encode_image(torch.stack([preprocess(im) for im in images]))
        txt = model.encode_text(tokenizer(["a photo of a dog", "a red cube", "x"]))
    cos = torch.nn.functional.cosine_similarity(img, txt, dim=-1)  # [3]
    assert torch.allclose(out.per_reward["clip_score"], cos, atol=1e-5)
    assert torch.allclose(out.total, 2.0 * cos, atol=1e-5)
    clipped = ClipScore(f"local-dir:{clip_dir}", scale=2.5, clip_at_zero=True)(prompts, images)
    assert clipped == pytest.approx((2.5 * cos.clamp_min(0)).tolist(), abs=1e-5)


def test_clip_model_loads_once(clip_dir):
    a = ClipScore(f"local-dir:{clip_dir}")
    b = RewardSet(["clip_score"], clip_score={"model_name": f"local-dir:{clip_dir}"}).rewards[0].fn
    assert a.parts()[0] is b.parts()[0]


def test_clip_score_errors(clip_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="'openai' are not a local file|would download"):
        ClipScore("ViT-B-32", pretrained="openai")
    with pytest.raises(ValueError, match="needs local weights"):
        ClipScore("ViT-B-32")
    with pytest.raises(ValueError, match="would download from the Hub"):
        ClipScore("hf-hub:someone/some-clip")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ClipScore(f"local-dir:{tmp_path / 'nope'}")
    rs = RewardSet(["clip_score"], clip_score={"model_name": f"local-dir:{clip_dir}"})
    with pytest.raises(RewardError, match="reward 'clip_score', sample 1: raised TypeError: clip_score needs PIL images"):
        rs(["a", "b"], [random_images(1)[0], "not an image"])


# ------------------------------------------------------------------ the CLIP colour classifier


def test_object_crop_composites_mask_on_grey_and_crops():
    img = Image.new("RGB", (20, 10), (255, 0, 0))
    mask = np.zeros((10, 20), dtype=bool)
    mask[2:6, 4:8] = True
    det = Detection("dog", (2.0, 1.0, 10.0, 7.0), 0.9, None, mask)
    crop = object_crop(img, det)
    assert crop.size == (8, 6)
    px = np.asarray(crop)
    assert tuple(px[1, 2]) == (255, 0, 0)  # inside the mask (image (4, 2))
    assert tuple(px[0, 0]) == (153, 153, 153)  # outside: GenEval's #999
    assert object_crop(img, det, bgcolor="original").getpixel((0, 0)) == (255, 0, 0)
    assert object_crop(img, det, crop="0").size == (20, 10)
    with pytest.raises(ValueError, match="does not match the image"):
        object_crop(img, Detection("dog", (0, 0, 1, 1), 1, None, np.zeros((3, 3), bool)))


def test_colour_classifier_matches_an_independent_zero_shot(clip_dir):
    clf = ClipColorClassifier(f"local-dir:{clip_dir}")
    img = random_images(1, seed=3, size=(32, 48))[0]
    dets = [Detection("dog", (0, 0, 20, 20)), Detection("dog", (10, 5, 40, 30)), Detection("dog", (30, 0, 48, 32))]
    got = clf(img, dets, "dog")
    model, preprocess, tokenizer = reference_clip(clip_dir)
    colors = ["red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white"]
    with torch.no_grad():
        weights = []
        for c in colors:
            e = model.encode_text(tokenizer([t.format(c=c, obj="dog") for t in TEMPLATES]))
            e = e / e.norm(dim=-1, keepdim=True)
            m = e.mean(0)
            weights.append(m / m.norm())
        w = torch.stack(weights, 1)  # [D, 10]
        feats = model.encode_image(torch.stack([preprocess(img.crop(tuple(int(v) for v in d.box))) for d in dets]))
        feats = feats / feats.norm(dim=-1, keepdim=True)
    assert got == [colors[i] for i in (feats @ w).argmax(1).tolist()]
    assert clf(img, [], "dog") == []


# ------------------------------------------------------------------ the hf detector backends


def test_coco_label_mapping():
    mapping = coco_label_map({0: "person", 1: "mouse", 2: "remote", 3: "keyboard", 4: "wall-other-merged", 5: "TV"}, coco_names())
    assert mapping == {0: "person", 1: "computer mouse", 2: "tv remote", 3: "computer keyboard", 5: "tv"}


@pytest.mark.parametrize("builder", [tiny_owlv2_dir, tiny_grounding_dino_dir, tiny_mask2former_dir])
def test_hf_detectors_end_to_end(builder, tmp_path):
    path = builder(tmp_path / "det")
    vocab = ["person", "bicycle", "computer mouse", "dog", "tv", "hot dog"]
    det = HFDetector(path, vocabulary=vocab, batch_size=2, names_per_query=4)
    images = random_images(3, seed=1)
    out = det.detect(images)
    assert len(out) == 3
    for dets, im in zip(out, images):
        assert dets, "a random model still proposes boxes"
        for d in dets:
            assert d.label in vocab and len(d.box) == 4 and all(math.isfinite(v) for v in d.box)
            assert 0.0 <= d.score <= 1.0 and d.color is None
            if d.mask is not None:  # Mask2Former: a full-size instance mask and its box
                assert d.mask.shape == (im.size[1], im.size[0]) and d.mask.any()
                ys, xs = np.nonzero(d.mask)
                assert d.box == (xs.min(), ys.min(), xs.max() + 1.0, ys.max() + 1.0)
    if builder is tiny_mask2former_dir:  # labels come from id2label through the COCO mapping ("mouse")
        assert {d.label for dets in out for d in dets} <= {"person", "bicycle", "computer mouse", "dog", "tv"}
    with pytest.raises(FileNotFoundError, match="not a local model directory"):
        HFDetector(tmp_path / "missing")


def test_hf_backend_with_colour_classifier_through_the_command_line(tmp_path, clip_dir):
    """`mmrl geneval evaluate --detector hf` with a tiny Mask2Former and the tiny CLIP colour classifier."""
    m2f = tiny_mask2former_dir(tmp_path / "m2f")
    # one colour record per class the detector knows, all on the same image: at least one class is detected there,
    # so the colour classifier has to run
    names = ["person", "bicycle", "computer mouse", "dog", "tv"]
    records = [{"tag": "colors", "include": [{"class": n, "count": 1, "color": "red"}], "prompt": f"a photo of a red {n}"}
               for n in names]
    records.append({"tag": "position", "include": [{"class": "person", "count": 1},
                                                   {"class": "computer mouse", "count": 1, "position": ["left of", 0]}],
                    "prompt": "a photo of a computer mouse left of a person"})
    image = random_images(1, seed=10)[0]
    for i, r in enumerate(records):
        (tmp_path / "imgs" / f"{i:05d}" / "samples").mkdir(parents=True)
        (tmp_path / "imgs" / f"{i:05d}" / "metadata.jsonl").write_text(json.dumps(r))
        image.save(tmp_path / "imgs" / f"{i:05d}" / "samples" / "0.png")
    mmrl = Path(sys.executable).with_name("mmrl")
    cmd = [str(mmrl)] if mmrl.exists() else [sys.executable, "-m", "mmrl.cli"]
    proc = subprocess.run(cmd + ["geneval", "evaluate", str(tmp_path / "imgs"), "--outfile", str(tmp_path / "r.jsonl"),
                                 "--detector", "hf", "--model-path", str(m2f), "--device", "cpu", "--quiet",
                                 "--options", "threshold=0", "counting_threshold=0", f"clip_model=local-dir:{clip_dir}"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(rows) == 6
    for row in rows:
        assert list(row) == ["filename", "tag", "prompt", "correct", "reason", "metadata", "details"]
        assert isinstance(row["correct"], bool)
        details = json.loads(row["details"])
        assert set(details) <= set(names)
        assert all(len(b) == 5 and b[4] > 0 for boxes in details.values() for b in boxes)
    # the same image gives the same detections in every row
    assert len({row["details"] for row in rows}) == 1
    detected = set(json.loads(rows[0]["details"]))
    classified = [r for r in rows[:5] if json.loads(r["metadata"])["include"][0]["class"] in detected]
    assert classified
    for r in classified:  # the classifier ran: correct, or a tally of the colours it saw
        assert r["correct"] or "; and " in r["reason"], r["reason"]
    for r in rows[:5]:
        if r not in classified:
            assert r["reason"].endswith(", found 0")


def test_evaluate_folder_with_open_vocabulary_detector(tmp_path):
    owl = HFDetector(tiny_owlv2_dir(tmp_path / "owl"), vocabulary=["dog", "cat"])
    record = {"tag": "two_object", "include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1}],
              "prompt": "a photo of a dog and a cat"}
    (tmp_path / "imgs/00000/samples").mkdir(parents=True)
    (tmp_path / "imgs/00000/metadata.jsonl").write_text(json.dumps(record))
    random_images(1)[0].save(tmp_path / "imgs/00000/samples/0000.png")
    rows = evaluate_folder(tmp_path / "imgs", owl, progress=False)
    assert len(rows) == 1 and rows[0]["tag"] == "two_object" and isinstance(rows[0]["correct"], bool)


# ------------------------------------------------------------------ GenEval rewards on the shapes world

POSITION = {"tag": "position", "include": [{"class": "circle", "count": 1},
                                           {"class": "square", "count": 1, "position": ["left of", 0]}],
            "prompt": "a photo of a square left of a circle"}
SINGLE = {"tag": "single_object", "include": [{"class": "square", "count": 1}], "prompt": "a photo of a square"}


def test_geneval_rewards_on_rendered_scenes():
    good = scene_for_metadata(POSITION, 0).render()
    wrong_side = Scene([SceneObject("circle", "red", 4, 0), SceneObject("square", "blue", 4, 8)]).render()
    two_squares = Scene([SceneObject("square", "red", 0, 0), SceneObject("square", "green", 6, 6)]).render()
    prompts = [POSITION["prompt"], POSITION["prompt"], SINGLE["prompt"]]
    meta = [POSITION, json.dumps(POSITION), SINGLE]  # dicts or JSON strings
    images = [good, wrong_side, two_squares]
    out = {name: REWARDS[name]()(prompts, images, metadata=meta) for name in ("geneval", "geneval_strict", "geneval_partial")}
    # official: position right / wrong side / at least one square
    assert [o["score"] for o in out["geneval"]] == [1.0, 0.0, 1.0]
    assert [o["score"] for o in out["geneval_strict"]] == [1.0, 0.0, 0.0]  # two squares are not exactly one
    # partial: wrong side = (1 + 1 + 0) / 3; two squares: 1 - |1 - 2| / 1 = 0
    assert out["geneval_partial"][0]["score"] == 1.0
    assert out["geneval_partial"][1]["score"] == pytest.approx(2 / 3)
    assert out["geneval_partial"][2]["score"] == 0.0
    assert out["geneval_partial"][2] == {"score": 0.0, "correct": 1.0, "strict": 0.0, "partial": 0.0}


def test_geneval_reward_in_a_reward_set_and_errors():
    img = scene_for_metadata(SINGLE, 1).render()
    rs = RewardSet(["geneval_partial", "geneval"], [1.0, 0.5])
    out = rs([SINGLE["prompt"]] * 2, [img, img], metadata=[SINGLE, SINGLE])
    assert out.total.tolist() == [1.5, 1.5]
    assert out.metrics["rewards/geneval_partial/strict/mean"] == 1.0 and out.extras["geneval/correct"] == [1.0, 1.0]
    with pytest.raises(RewardError, match="metadata"):
        rs(["p"], [img])
    with pytest.raises(RewardError, match="sample 0: raised TypeError: GenEval rewards need PIL images"):
        rs(["p"], ["text"], metadata=[SINGLE])
    with pytest.raises(ValueError, match="detect on the fly"):
        REWARDS["geneval"](detector="precomputed")
    with pytest.raises(ValueError, match="unknown GenEval option"):
        REWARDS["geneval"](options={"treshold": 0.1})
