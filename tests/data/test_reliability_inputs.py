"""Issue 17, items 11-15: bad inputs named before work starts (sizes, YAML, dataset files, tiny-world dataset_path),
a full disk reported as such, and `mmrl geneval evaluate` scoring past bad images and folders."""
import errno
import json
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from PIL import Image

import mmrl.checkpointing.checkpoint as checkpoint
from mmrl.config.train_config import ConfigError, load_config
from mmrl.data.tasks import load_task, read_rows
from mmrl.data.validate import DataError
from mmrl.training.trainer import Trainer
from tiny_world_fixtures import vowel_reward

BASE = dict(method="grpo", family="causal_lm", num_generations=4, per_device_train_batch_size=8, max_completion_length=8,
            progress_bar=False, report_to=["jsonl"])


# ------------------------------------------------------------------------------------------- 11. sizes

@pytest.mark.parametrize("values,needle", [
    (dict(max_completion_length=0, family="masked_diffusion", diffusion_steps=4), r"max_completion_length=0 must be >= 1"),
    (dict(block_length=0, family="masked_diffusion"), r"block_length=0 must be >= 1"),
    (dict(num_generations=2**20, per_device_train_batch_size=2**20), r"num_generations=1048576 is beyond 1024 responses per prompt"),
    (dict(per_device_train_batch_size=2**17), r"= 131072 responses per process is beyond 65536"),
    (dict(max_completion_length=10**6), r"max_completion_length=1000000 is beyond 131072 tokens"),
])
def test_impossible_sizes_are_named_by_the_validator(values, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(None, {**BASE, **values})


# ------------------------------------------------------------------------------------------- 12. tasks and YAML

def test_tiny_world_tasks_refuse_a_dataset_path_instead_of_ignoring_it(tmp_path):
    (tmp_path / "mine.jsonl").write_text('{"prompt": "x"}\n')
    for task in ("sudoku4", "countdown3", "shapes"):
        with pytest.raises(ValueError, match=rf"task '{task}' generates its own data and does not read dataset_path=.*task=jsonl"):
            load_task(task, str(tmp_path / "mine.jsonl"))
    assert load_task("sudoku4").train  # without a dataset_path it loads


def test_broken_yaml_is_a_config_error_with_line_and_column(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: grpo\nlearning_rate: [1e-4\nseed: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:\d+:\d+: not valid YAML"):
        load_config(bad)


# ------------------------------------------------------------------------------------------- 13. dataset files

@pytest.mark.parametrize("name,content,needle", [
    ("empty.jsonl", b"", r"empty\.jsonl: no rows"),
    ("blank.jsonl", b"\n\n  \n", r"blank\.jsonl: no rows"),
    ("bad.jsonl", b'{"prompt": "a"}\n\n{"prompt": "b"}\n{"prompt": "c",\n', r"bad\.jsonl:4:\d+: not valid JSON"),
    ("latin1.jsonl", b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n', r"latin1\.jsonl:2:16: not UTF-8 text \(byte 0xe9\)"),
    ("lists.jsonl", b'{"prompt": "a"}\n[1, 2]\n', r"lists\.jsonl:2: each line must be a JSON object of columns, got list"),
    ("empty.csv", b"", r"empty\.csv: no rows"),
    ("latin1.csv", b"prompt\nok\ncaf\xe9\n", r"latin1\.csv:3:4: not UTF-8 text"),
    ("rows.json", b'[{"prompt": "a"}, [1]]', r"rows\.json: row 1 must be an object of columns, got list"),
])
def test_dataset_files_are_validated_with_file_line_and_column(tmp_path, name, content, needle):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=needle):
        read_rows(tmp_path / name)


def test_a_null_prompt_stops_before_the_model_loads(tmp_path):
    (tmp_path / "data.jsonl").write_text('{"prompt": "a"}\n{"prompt": null}\n{"prompt": "c"}\n')
    cfg = load_config(None, {**BASE, "task": "jsonl", "dataset_path": str(tmp_path / "data.jsonl"), "output_dir": str(tmp_path / "run"),
                             "model_name_or_path": str(tmp_path / "no-model-loaded")})
    with pytest.raises(DataError, match=r"row 1: the prompt is NoneType None; a prompt is a non-empty string"):
        Trainer(cfg, reward_funcs=[vowel_reward])


# ------------------------------------------------------------------------------------------- 14. disk full

def _opt():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def test_disk_full_inside_torch_save_is_reported_as_no_space(tmp_path, monkeypatch):
    opt, sched = _opt()
    save = lambda step: checkpoint.save_checkpoint(tmp_path, step, save_model=lambda p: p.mkdir(), optimizer=opt,  # noqa: E731
                                                   scheduler=sched, buffer=None, state={"step": step}, keep=2)
    save(1)

    def zip_writer_fails(obj, f, *a, **k):
        Path(f).write_bytes(b"PK partial")
        raise RuntimeError("[enforce fail at inline_container.cc:783] . PytorchStreamWriter failed writing file data/0: file write failed")

    Usage = namedtuple("Usage", "total used free")
    real_usage = shutil.disk_usage
    monkeypatch.setattr(checkpoint.torch, "save", zip_writer_fails)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 4096, 4096)
                        if "checkpoints" in str(p) and list(Path(p).glob(".tmp-*")) else real_usage(p))
    with pytest.raises(OSError, match=r"No space left on device while writing checkpoint 2 .*PytorchStreamWriter") as e:
        save(2)
    assert e.value.errno == errno.ENOSPC
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["checkpoint-000001"]  # partial copy removed


def test_a_checkpoint_that_cannot_fit_is_refused_before_writing(tmp_path, monkeypatch):
    opt, sched = _opt()
    checkpoint.save_checkpoint(tmp_path, 1, save_model=lambda p: p.mkdir(), optimizer=opt, scheduler=sched, buffer=None,
                               state={"step": 1}, keep=2)
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 100, 100))
    with pytest.raises(OSError, match=r"No space left on device for checkpoint .*MiB needed \(the size of checkpoint-000001\)"):
        checkpoint.save_checkpoint(tmp_path, 2, save_model=lambda p: p.mkdir(), optimizer=opt, scheduler=sched, buffer=None,
                                   state={"step": 2}, keep=2)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["checkpoint-000001"]


# ------------------------------------------------------------------------------------------- 15. geneval evaluate

@pytest.fixture
def shapes_images(tmp_path):
    """6 shapes-world prompt folders drawn by the exact oracle renderer, two images each."""
    from tiny_world_fixtures import shapes_image_folders

    return shapes_image_folders(tmp_path / "imgs", 6)


def evaluate(root):
    from mmrl.geneval.detectors import build_detector
    from mmrl.geneval.scoring import evaluate_folder

    return evaluate_folder(root, build_detector("shapes"), progress=False)


def test_geneval_one_bad_image_or_folder_does_not_abort_or_inflate_the_score(shapes_images):
    root = shapes_images
    assert all(r["correct"] for r in evaluate(root))  # the oracle's images are all correct
    Image.new("RGB", (1, 1)).save(root / "00000/samples/0000.png")  # the detector cannot read a 1x1 image
    shutil.rmtree(root / "00001/samples")  # a prompt folder without images
    (root / "00002/metadata.jsonl").write_text("{not json")  # a bad metadata record
    Image.new("RGB", (8, 8)).save(root / "00003/samples/0002.PNG")  # skipped as the official script does, but reported
    rows = evaluate(root)
    by_error = {r.get("error"): r for r in rows}
    assert by_error["detector_failed"]["filename"].endswith("00000/samples/0000.png") and not by_error["detector_failed"]["correct"]
    assert "smaller than" in by_error["detector_failed"]["reason"]
    assert by_error["no_images"]["filename"].endswith("00001/samples") and not by_error["no_images"]["correct"]
    assert len(rows) == 2 + 1 + 2 * 3  # 00000: both images; 00001: one failed row; 00002: skipped; 00003-00005: 2 each
    assert [p for p, _ in rows.skipped] == [str(root / "00002/metadata.jsonl")]
    assert rows.ignored == [str(root / "00003/samples/0002.PNG")]


def test_geneval_huge_images_are_refused_from_their_header(shapes_images, monkeypatch):
    import mmrl.geneval.scoring as scoring

    Image.new("RGB", (600, 500)).save(shapes_images / "00000/samples/0001.png")
    monkeypatch.setattr(scoring, "MAX_IMAGE_PIXELS", 500 * 500)  # stands in for 9000x9000 against 4096x4096
    decoded = []
    real_load = Image.Image.load
    monkeypatch.setattr(Image.Image, "load", lambda self: decoded.append(self.size) or real_load(self))
    rows = evaluate(shapes_images)
    big = [r for r in rows if r.get("error") == "too_large"]
    assert len(big) == 1 and big[0]["filename"].endswith("00000/samples/0001.png")
    assert "600x500 px is larger than 250000 pixels; not decoded" in big[0]["reason"]
    assert (600, 500) not in decoded


def test_geneval_cli_exits_2_and_names_skipped_folders_but_writes_the_rest(shapes_images, tmp_path):
    import subprocess
    import sys

    (shapes_images / "00002/metadata.jsonl").unlink()
    out = tmp_path / "r.jsonl"
    proc = subprocess.run([sys.executable, "-m", "mmrl.cli", "geneval", "evaluate", str(shapes_images), "--outfile", str(out),
                           "--detector", "shapes", "--quiet"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "prompt folder skipped, not scored:" in proc.stderr and "00002/metadata.jsonl is missing" in proc.stderr
    assert len(out.read_text().splitlines()) == 10
