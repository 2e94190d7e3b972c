"""Issue 30, group 7: GenEval evaluate keeps going past bad prompt folders and samples: deeply nested or huge
metadata skips its folder (the others are scored), a FIFO among the images is an error row (never opened, so never
blocks), and each prompt's metadata is serialised once and shared by its rows."""
import json
import os

import pytest

from mmrl.geneval.scoring import MAX_METADATA_BYTES, evaluate_folder


@pytest.fixture
def shapes_images(tmp_path):
    """3 shapes-world prompt folders drawn by the exact oracle renderer, two images each."""
    from tiny_world_fixtures import shapes_image_folders

    return shapes_image_folders(tmp_path / "imgs", 3)


def evaluate(root):
    from mmrl.geneval.detectors import build_detector

    return evaluate_folder(root, build_detector("shapes"), progress=False)


def test_nested_or_huge_metadata_skips_only_its_folder(shapes_images):
    root = shapes_images
    (root / "00000/metadata.jsonl").write_text("[" * 100000 + "]" * 100000)  # beyond Python's JSON recursion limit
    (root / "00001/metadata.jsonl").write_text(json.dumps({"tag": "single_object", "prompt": "x" * MAX_METADATA_BYTES,
                                                           "include": [{"class": "circle", "count": 1}]}))
    rows = evaluate(root)
    assert dict((os.path.basename(os.path.dirname(p)), why) for p, why in rows.skipped).keys() == {"00000", "00001"}
    assert "nested too deeply" in rows.skipped[0][1] and "more than the 1,048,576 a metadata record" in rows.skipped[1][1]
    assert len(rows) == 2 and all(r["filename"].startswith(str(root / "00002")) and r["correct"] for r in rows)


def test_a_fifo_among_the_images_is_an_error_row_not_a_hang(shapes_images):
    fifo = shapes_images / "00001/samples/0002.png"
    os.mkfifo(fifo)
    rows = evaluate(shapes_images)  # opening the FIFO would block forever
    bad = [r for r in rows if r.get("error") == "not_a_file"]
    assert [r["filename"] for r in bad] == [str(fifo)] and not bad[0]["correct"] and "not a regular file" in bad[0]["reason"]
    assert sum(r["correct"] for r in rows) == 6  # every real image still scored


def test_each_prompts_metadata_is_serialised_once(shapes_images, monkeypatch):
    import mmrl.geneval.scoring as scoring

    calls = []
    real = json.dumps
    monkeypatch.setattr(scoring.json, "dumps", lambda obj, *a, **k: calls.append(type(obj).__name__) or real(obj, *a, **k))
    rows = evaluate(shapes_images)
    monkeypatch.undo()
    metadata_dumps = [c for c in calls if c == "dict"]
    assert len(rows) == 6 and len(metadata_dumps) == 3 + 6  # 3 prompts' metadata once each, plus each row's details
    assert rows[0]["metadata"] is rows[1]["metadata"]  # one string shared by the prompt's rows
