"""`mmrl geneval` as a user runs it: subprocess tests of prompts / generate / evaluate / summary, bad inputs included."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from mmrl.geneval.prompts import OFFICIAL_METADATA, official_metadata
from mmrl.geneval.rules import TASKS

from cli_batch import run_cli_batch  # tests/helpers/

MMRL = Path(sys.executable).with_name("mmrl")
OFFICIAL_KEYS = ["filename", "tag", "prompt", "correct", "reason", "metadata", "details"]


def mmrl(*args, cwd=None, check=True):
    cmd = [str(MMRL)] if MMRL.exists() else [sys.executable, "-m", "mmrl.cli"]
    proc = subprocess.run(cmd + [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    if check and proc.returncode != 0:
        raise AssertionError(f"mmrl {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(autouse=True)
def _outside_the_repository(tmp_path, monkeypatch):
    """`geneval evaluate` without --outfile writes results.jsonl into the working directory: a temporary one."""
    monkeypatch.chdir(tmp_path)


def fails(*args, cwd=None):
    proc = mmrl(*args, cwd=cwd, check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr


# ------------------------------------------------------------------ detections that satisfy (or break) a record

OFFSETS = {"left of": (-200, 0), "right of": (200, 0), "above": (0, -200), "below": (0, 200)}


def satisfying_objects(record):
    """Detections that the official rule accepts for `record`: clause i around its own anchor point, a positioned
    clause 200 px from its target in the named direction, colours as asked, scores above 0.9."""
    anchors, objects = [], []
    for i, clause in enumerate(record["include"]):
        if "position" in clause:
            rel, j = clause["position"]
            x, y = anchors[j][0] + OFFSETS[rel][0], anchors[j][1] + OFFSETS[rel][1]
        else:
            x, y = 1000 + 400 * i, 1000
        anchors.append((x, y))
        for k in range(clause["count"]):
            objects.append({"class": clause["class"], "box": [x + k, y, x + k + 50, y + 50], "score": 0.95,
                            "color": clause.get("color")})
    return objects


def make_images(root: Path, records, samples=1):
    for i, r in enumerate(records):
        folder = root / f"{i:05d}"
        (folder / "samples").mkdir(parents=True)
        (folder / "metadata.jsonl").write_text(json.dumps(r) + "\n")
        for k in range(samples):
            Image.new("RGB", (8, 8), (153, 153, 153)).save(folder / "samples" / f"{k:04d}.png")


def test_official_prompts_evaluate_through_precomputed(tmp_path):
    """All 553 official records: even-numbered images get satisfying detections, odd ones lose their last object."""
    records = official_metadata()
    make_images(tmp_path / "IMAGES_DIR", records)
    with open(tmp_path / "dets.jsonl", "w") as f:
        for i, r in enumerate(records):
            objs = satisfying_objects(r)
            if i % 2:
                objs = objs[:-1]
            f.write(json.dumps({"image": f"{i:05d}/samples/0000.png", "objects": objs}) + "\n")
    # the command lines exactly as documented
    mmrl("geneval", "evaluate", "IMAGES_DIR", "--outfile", "results.jsonl", "--detector", "precomputed",
         "--detections", "dets.jsonl", cwd=tmp_path)
    out = mmrl("geneval", "summary", "results.jsonl", "--json", cwd=tmp_path).stdout
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 553
    for i, (row, record) in enumerate(zip(rows, records)):
        assert list(row) == OFFICIAL_KEYS
        assert row["filename"] == os.path.join("IMAGES_DIR", f"{i:05d}", "samples", "0000.png")
        assert json.loads(row["metadata"]) == record and row["tag"] == record["tag"] and row["prompt"] == record["prompt"]
        assert row["correct"] is (i % 2 == 0), (i, row["reason"])
        last = record["include"][-1]
        if i % 2:
            assert f"expected {last['class']}>={last['count']}, found {last['count'] - 1}" in row["reason"]
        details = json.loads(row["details"])
        assert sum(len(v) for v in details.values()) == len(satisfying_objects(record)) - (i % 2)
    # expected summary, counted independently of the code under test
    s = json.loads(out)
    per_task = {t: [sum(1 for i, r in enumerate(records) if r["tag"] == t and i % 2 == 0),
                    sum(1 for r in records if r["tag"] == t)] for t in TASKS}
    assert s["images"] == 553 and s["prompts"] == 553
    assert s["correct_images"] == pytest.approx(277 / 553)
    assert s["correct_prompts"] == pytest.approx(277 / 553)
    assert list(s["tasks"]) == list(TASKS)  # first-seen order of the official file
    for t, (k, n) in per_task.items():
        assert (s["tasks"][t]["correct"], s["tasks"][t]["total"]) == (k, n)
    assert s["overall"] == pytest.approx(sum(k / n for k, n in per_task.values()) / 6)


def test_summary_arithmetic_on_a_hand_made_file(tmp_path):
    rows = []

    def add(tag, meta, corrects):
        for c in corrects:
            rows.append({"filename": "x.png", "tag": tag, "prompt": meta, "correct": c, "reason": "", "metadata": meta, "details": "{}"})

    add("single_object", "A", [True, True, True, False])
    add("two_object", "B", [False] * 4)
    add("two_object", "C", [False, False, True, False])
    add("counting", "D", [True, True])
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = json.loads(mmrl("geneval", "summary", tmp_path / "r.jsonl", "--json").stdout)
    # 14 images, 4 prompts; 6/14 images correct; prompts A, C, D have a correct image: 3/4
    assert (s["images"], s["prompts"]) == (14, 4)
    assert s["correct_images"] == pytest.approx(6 / 14) and s["correct_prompts"] == 0.75
    assert s["tasks"]["two_object"] == {"correct": 1, "total": 8, "accuracy": 0.125}
    assert s["overall"] == pytest.approx((0.75 + 0.125 + 1.0) / 3)  # mean of task accuracies, not of images
    text = mmrl("geneval", "summary", tmp_path / "r.jsonl").stdout
    assert "Total images: 14\nTotal prompts: 4\n% correct images: 42.86%\n% correct prompts: 75.00%" in text
    assert "two_object       = 12.50% (1 / 8)" in text
    assert "Overall score (avg. over tasks): 0.62500" in text


def test_missing_and_corrupt_images_are_recorded_and_the_rest_scored(tmp_path):
    records = [official_metadata()[0], official_metadata()[1]]
    make_images(tmp_path / "imgs", records, samples=2)
    (tmp_path / "imgs/00000/samples/0001.png").write_bytes(b"not a png at all")
    (tmp_path / "imgs/00001/samples/notes.txt").write_text("ignored: not a <digits>.png name")
    lines = [
        {"image": "00000/samples/0000.png", "objects": satisfying_objects(records[0])},
        {"image": "00000/samples/0001.png", "objects": []},
        {"image": "./00000/samples/0002.png", "objects": []},  # listed but not on disk
        {"image": "00001/samples/0000.png", "objects": satisfying_objects(records[1])},
        {"image": "00099/samples/0000.png", "objects": []},  # outside the folder: warned about
    ]  # 00001/samples/0001.png has no line
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    proc = mmrl("geneval", "evaluate", tmp_path / "imgs", "--outfile", tmp_path / "r.jsonl", "--detector", "precomputed",
                "--detections", tmp_path / "d.jsonl", "--quiet")
    assert "1 detections lines name images outside" in proc.stderr
    rows = {Path(r["filename"]).parent.parent.name + "/" + Path(r["filename"]).name: r
            for r in map(json.loads, (tmp_path / "r.jsonl").read_text().splitlines())}
    assert sorted(rows) == ["00000/0000.png", "00000/0001.png", "00000/0002.png", "00001/0000.png", "00001/0001.png"]
    assert rows["00000/0000.png"]["correct"] and "error" not in rows["00000/0000.png"]
    assert rows["00000/0001.png"]["error"] == "unreadable" and not rows["00000/0001.png"]["correct"]
    assert rows["00000/0002.png"]["error"] == "missing" and rows["00000/0002.png"]["reason"] == "image file is missing"
    assert rows["00001/0001.png"]["error"] == "no_detections"
    assert rows["00001/0000.png"]["correct"]
    s = json.loads(mmrl("geneval", "summary", tmp_path / "r.jsonl", "--json").stdout)
    assert s["errors"] == 3 and s["images"] == 5 and s["correct_images"] == pytest.approx(2 / 5)
    assert "Images with errors (scored incorrect): 3" in mmrl("geneval", "summary", tmp_path / "r.jsonl").stdout


def test_bad_inputs_give_clear_errors(tmp_path):
    """Every bad input exits 2 with a one-line message naming it (no traceback). The command lines run in one child
    process through the console script's `main` (tests/helpers/cli_batch.py): one start-up instead of 22."""
    make_images(tmp_path / "imgs", [official_metadata()[300]])  # a colors record
    imgs = tmp_path / "imgs"

    def detections(name, *rows, raw=None):
        path = tmp_path / name
        path.write_text(raw if raw is not None else "".join(json.dumps(r) + "\n" for r in rows))
        return path

    record = official_metadata()[300]
    no_colour = {k: v for k, v in satisfying_objects(record)[0].items() if k != "color"}
    pre = ("geneval", "evaluate", imgs, "--detector", "precomputed", "--detections")
    cases = [
        # precomputed without a detections file
        (("geneval", "evaluate", imgs, "--detector", "precomputed"), "needs a detections file"),
        # a malformed detections line names file and line
        ((*pre, detections("d.jsonl", raw='{"image": "00000/samples/0000.png", "objects": []}\n{"image": 3}\n')), "d.jsonl:2"),
        ((*pre, detections("box.jsonl", {"image": "a.png", "objects": [{"class": "dog", "box": [5, 0, 1, 1], "score": 1}]})),
         "x2 < x1"),
        ((*pre, detections("score.jsonl", {"image": "a.png", "objects": [{"class": "dog", "box": [0, 0, 1, 1], "score": "high"}]})),
         "'score' must be a finite number"),
        # a colour clause, detections without colour and no colour classifier: the image is named
        ((*pre, detections("colour.jsonl", {"image": "00000/samples/0000.png", "objects": [no_colour]}),
          "--outfile", tmp_path / "r.jsonl"), "no colour"),
        # unknown option / bad value / unknown detector / missing folder
        (("geneval", "evaluate", imgs, "--detector", "shapes", "--options", "treshold=1"), "valid options"),
        (("geneval", "evaluate", imgs, "--detector", "shapes", "--options", "threshold=high"), "threshold expects a float"),
        (("geneval", "evaluate", imgs, "--detector", "yolo"), "invalid choice"),
        (("geneval", "evaluate", tmp_path / "nowhere", "--detector", "shapes"), "does not exist"),
        # hf / mmdet without their inputs
        (("geneval", "evaluate", imgs, "--detector", "hf"), "--model-path"),
        (("geneval", "evaluate", imgs, "--detector", "hf", "--model-path", tmp_path), "is not a local model directory"),
        (("geneval", "evaluate", imgs, "--detector", "mmdet"), "mmdet"),
        # summary of missing / malformed files
        (("geneval", "summary", tmp_path / "none.jsonl"), "does not exist"),
        (("geneval", "summary", detections("bad.jsonl", raw='{"tag": "colors", "metadata": "{}", "correct": "yes"}\n')),
         "'correct' must be true or false"),
        # prompts
        (("geneval", "prompts", "-o", tmp_path / "p", "--vocabulary", "nope"), "unknown vocabulary"),
        (("geneval", "prompts", "-o", tmp_path / "p", "--colors", "red"), "--colors applies to a generated suite"),
        # generate: missing model / unknown family
        (("geneval", "generate", "--family", "janus", "--outdir", tmp_path / "g"), "--model"),
        (("geneval", "generate", "--family", "nope", "--model", tmp_path, "--outdir", tmp_path / "g"), "unknown model family"),
    ]
    # a prompt folder without metadata (last: the folder it adds would change the cases above)
    late = [(("geneval", "evaluate", imgs, "--detector", "shapes"), "metadata.jsonl is missing")]
    results = run_cli_batch([argv for argv, _ in cases], cwd=tmp_path)
    (imgs / "00001/samples").mkdir(parents=True)
    results += run_cli_batch([argv for argv, _ in late], cwd=tmp_path)
    for (argv, expected), got in zip(cases + late, results):
        line = " ".join(map(str, argv))
        assert got["code"] == 2, (line, got)
        assert "Traceback" not in got["stderr"], (line, got["stderr"])
        assert expected in got["stderr"], (line, expected, got["stderr"])
    # the colour case names the image
    assert "0000.png" in results[4]["stderr"]


def test_prompts_command(tmp_path):
    mmrl("geneval", "prompts", "-o", tmp_path / "official")
    assert (tmp_path / "official/evaluation_metadata.jsonl").read_text() == OFFICIAL_METADATA.read_text()
    prompts = (tmp_path / "official/generation_prompts.txt").read_text().splitlines()
    assert prompts == [r["prompt"] for r in official_metadata()]
    # regenerating over COCO with the official seed gives the official suite again
    mmrl("geneval", "prompts", "-o", tmp_path / "coco", "--vocabulary", "coco", "--seed", "43")
    assert (tmp_path / "coco/evaluation_metadata.jsonl").read_text() == OFFICIAL_METADATA.read_text()
    out = mmrl("geneval", "prompts", "-o", tmp_path / "shapes", "--vocabulary", "shapes", "-n", "20", "--seed", "1").stdout
    recs = [json.loads(x) for x in (tmp_path / "shapes/evaluation_metadata.jsonl").read_text().splitlines()]
    from mmrl.tiny_world.shapes import SHAPE_NAMES

    assert {c["class"] for r in recs for c in r["include"]} <= set(SHAPE_NAMES)
    assert {"square", "circle", "triangle"} <= set(SHAPE_NAMES)
    assert {r["tag"] for r in recs} == set(TASKS) and f"wrote {len(recs)} records" in out


def test_shapes_world_end_to_end(tmp_path):
    """prompts -> generate (the exact shapes renderer) -> evaluate (the exact detector) -> summary: everything correct."""
    mmrl("geneval", "prompts", "-o", tmp_path / "p", "--vocabulary", "shapes", "-n", "6")
    meta = tmp_path / "p/evaluation_metadata.jsonl"
    n = len(meta.read_text().splitlines())
    mmrl("geneval", "generate", "--family", "shapes-oracle", "--metadata", meta, "--outdir", tmp_path / "img",
         "--n-samples", "2", "--batch-size", "3")
    assert sorted(p.name for p in (tmp_path / "img").iterdir()) == [f"{i:05d}" for i in range(n)]
    assert sorted(os.listdir(tmp_path / "img/00000/samples")) == ["0000.png", "0001.png"]
    assert json.loads((tmp_path / "img/00003/metadata.jsonl").read_text()) == json.loads(meta.read_text().splitlines()[3])
    mmrl("geneval", "evaluate", tmp_path / "img", "--outfile", tmp_path / "r.jsonl", "--detector", "shapes")
    s = json.loads(mmrl("geneval", "summary", tmp_path / "r.jsonl", "--json").stdout)
    assert s["images"] == 2 * n and s["overall"] == 1.0 and s["correct_images"] == 1.0
    # --skip-existing keeps finished folders; a fresh image then changes nothing
    proc = mmrl("geneval", "generate", "--family", "shapes-oracle", "--metadata", meta, "--outdir", tmp_path / "img",
                "--n-samples", "2", "--skip-existing")
    assert "wrote 0 images for 0 prompts" in proc.stdout


def test_generate_with_the_tiny_janus_adapter(tmp_path):
    """`generate` runs a real image policy (a tiny random Janus model saved to a local folder) through
    load_policy -> sample -> completions, then the shapes detector scores what it drew. The commands after `prompts`
    run in one child process (tests/helpers/cli_batch.py), so the second `generate` also shows that seeding does not
    depend on what ran before it in the process."""
    from mmrl.models.janus import JanusAdapter

    JanusAdapter.tiny(grid=(12, 12), codebook_size=8, cell_px=8).save_pretrained(tmp_path / "janus")
    meta = tmp_path / "m.jsonl"
    mmrl("geneval", "prompts", "-o", tmp_path / "p", "--vocabulary", "shapes", "-n", "2")
    records = (tmp_path / "p/evaluation_metadata.jsonl").read_text().splitlines()[:3]
    meta.write_text("\n".join(records) + "\n")
    generate = ("geneval", "generate", "--family", "janus", "--model", tmp_path / "janus", "--metadata", meta)
    gen_a, gen_b, evaluate, summary, bogus = run_cli_batch([
        [*generate, "--outdir", tmp_path / "a", "--n-samples", "2", "--batch-size", "2", "--seed", "7", "--gen", "cfg_scale=3"],
        [*generate, "--outdir", tmp_path / "b", "--n-samples", "2", "--batch-size", "2", "--seed", "7", "--gen", "cfg_scale=3"],
        ["geneval", "evaluate", tmp_path / "a", "--outfile", tmp_path / "r.jsonl", "--detector", "shapes"],
        ["geneval", "summary", tmp_path / "r.jsonl", "--json"],
        [*generate, "--outdir", tmp_path / "c", "--gen", "bogus=1"],
    ], cwd=tmp_path)
    assert gen_a["code"] == gen_b["code"] == evaluate["code"] == summary["code"] == 0, (gen_a, gen_b, evaluate, summary)
    for i in range(3):
        for k in range(2):
            a = Image.open(tmp_path / f"a/{i:05d}/samples/{k:04d}.png")
            assert a.size == (96, 96)
            assert a.tobytes() == Image.open(tmp_path / f"b/{i:05d}/samples/{k:04d}.png").tobytes()  # seeded
    s = json.loads(summary["stdout"])
    assert s["images"] == 6 and s["prompts"] == 3
    assert bogus["code"] == 2 and "Traceback" not in bogus["stderr"]
    assert "unknown" in bogus["stderr"] and "bogus" in bogus["stderr"]
