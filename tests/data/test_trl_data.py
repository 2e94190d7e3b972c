"""Data as TRL users pass it: files and saved datasets through `datasets.load_dataset`, an explicit hold-out, and
start-up errors (missing model directory, missing or malformed data, no prompt column) in one line, before any
model loads."""
from __future__ import annotations

import json
import logging

import pytest

from mmrl.config.train_config import load_config
from mmrl.data.loading import DatasetError, holdout, load_rows
from mmrl.data.tasks import load_task

ROWS = [{"prompt": f"say {i}", "answer": str(i)} for i in range(10)]


def write_formats(d):
    import datasets

    d.mkdir(exist_ok=True)
    (d / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (d / "r.json").write_text(json.dumps(ROWS))
    (d / "r.csv").write_text("prompt,answer\n" + "".join(f"{r['prompt']},{r['answer']}\n" for r in ROWS))
    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(d / "r.parquet"))
    ds.save_to_disk(str(d / "saved"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(str(d / "saved_dict"))
    return d


@pytest.mark.parametrize("name", ["r.jsonl", "r.json", "r.csv", "r.parquet", "saved"])
def test_every_format_gives_the_same_rows(tmp_path, name):
    d = write_formats(tmp_path / "data")
    assert load_rows(d / name) == ROWS


def test_csv_keeps_strings_and_saved_dict_splits(tmp_path):
    (tmp_path / "s.csv").write_text("Puzzle,Solution\n0030100000020400,4231134231242413\n")
    assert load_rows(tmp_path / "s.csv") == [{"Puzzle": "0030100000020400", "Solution": "4231134231242413"}]
    d = write_formats(tmp_path / "data")
    assert len(load_rows(d / "saved_dict", split="test")) == 3
    task = load_task("jsonl", str(d / "saved_dict"))
    assert len(task.train) == 10 and len(task.test) == 3


def test_bad_data_errors_name_the_path(tmp_path):
    with pytest.raises(DatasetError, match=f"dataset file not found: {tmp_path}/nope.jsonl"):
        load_rows(tmp_path / "nope.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(DatasetError, match=r"bad.jsonl:2:\d+: not valid JSON"):
        load_rows(tmp_path / "bad.jsonl")
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(DatasetError, match="unsupported dataset format '.txt'"):
        load_rows(tmp_path / "x.txt")
    (tmp_path / "noprompt.jsonl").write_text('{"question": "a"}\n')
    with pytest.raises(DatasetError, match="row 0 has no 'prompt' column \\(columns: \\['question'\\]\\)"):
        load_task("jsonl", str(tmp_path / "noprompt.jsonl"))
    with pytest.raises(DatasetError, match="some-org/some-set.*Hub"):  # tests run offline
        load_rows("some-org/some-set")


def test_eval_split_is_explicit_and_printed(tmp_path, caplog):
    d = write_formats(tmp_path / "data")
    task = load_task("jsonl", str(d / "r.jsonl"))
    assert len(task.train) == 10 and task.test == []  # nothing held out silently
    with caplog.at_level(logging.INFO, logger="mmrl.data.tasks"):
        task = load_task("jsonl", str(d / "r.jsonl"), eval_split=3)
    assert [r["prompt"] for r in task.test] == ["say 7", "say 8", "say 9"] and len(task.train) == 7
    assert "holding out the last 3 of 10 rows" in caplog.text
    task = load_task("jsonl", str(d / "r.jsonl"), eval_split=0.2)
    assert len(task.test) == 2
    assert holdout(list(range(5)), 0.01) == ([0, 1, 2, 3], [4])  # at least one row
    with pytest.raises(DatasetError, match="nothing left to train on"):
        holdout(list(range(3)), 3)
    with pytest.raises(Exception, match="eval_split=1.5"):
        load_config(None, {"eval_split": 1.5})


def test_startup_errors_are_one_line(tmp_path, capsys):
    from mmrl.cli import main

    d = write_formats(tmp_path / "data")
    (tmp_path / "noprompt.jsonl").write_text('{"question": "a"}\n')
    (tmp_path / "bad.jsonl").write_text('{"prompt": \n')
    cases = [
        (["task=jsonl", f"dataset_path={d / 'r.jsonl'}", f"model_name_or_path={tmp_path / 'no-model'}"], "no-model"),
        (["task=jsonl", f"dataset_path={tmp_path / 'missing.jsonl'}"], "missing.jsonl"),
        (["task=jsonl", f"dataset_path={tmp_path / 'bad.jsonl'}"], "bad.jsonl"),
        (["task=jsonl", f"dataset_path={tmp_path / 'noprompt.jsonl'}"], "'prompt'"),
    ]
    for args, needle in cases:
        code = main(["train", *args, f"output_dir={tmp_path / 'run'}", "progress_bar=false", "max_steps=1"])
        err = capsys.readouterr().err
        assert code == 2, err[-2000:]
        lines = [ln for ln in err.splitlines() if ln.startswith("mmrl train:")]
        assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err, err[-2000:]


def test_no_prompt_column_fails_before_the_model_loads(tmp_path, monkeypatch):
    import mmrl.training.trainer as trainer_mod

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr(trainer_mod, "build_policy", no_model)
    cfg = load_config(None, dict(output_dir=str(tmp_path), progress_bar=False))
    with pytest.raises(DatasetError, match="row 1 has no 'prompt' column"):
        trainer_mod.Trainer(cfg, dataset=[{"prompt": "a"}, {"text": "b"}], reward_funcs=[lambda completions, **k: [0.0] * len(completions)])
    cfg = load_config(None, dict(output_dir=str(tmp_path), progress_bar=False, model_name_or_path=str(tmp_path / "absent")))
    with pytest.raises(FileNotFoundError, match="absent.*no such model directory"):
        trainer_mod.Trainer(cfg, dataset=[{"prompt": "a"}])


# ------------------------------------------------------------------ every layout datasets.load_dataset reads

def test_train_only_and_train_validation_dataset_dicts(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(ROWS)
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "train_only"))
    datasets.DatasetDict({"train": ds, "validation": ds.select(range(2))}).save_to_disk(str(tmp_path / "train_val"))
    t = load_task("jsonl", str(tmp_path / "train_only"))
    assert t.train == ROWS and t.test == []  # most Hub sets: nothing held out unless asked (TRL trains on it all)
    t = load_task("jsonl", str(tmp_path / "train_only"), eval_split=3)
    assert t.train == ROWS[:7] and t.test == ROWS[7:]
    t = load_task("jsonl", str(tmp_path / "train_val"))
    assert t.train == ROWS and t.test == ROWS[:2]
    with pytest.raises(DatasetError, match="has its own validation split; eval_split=3 holds rows out only"):
        load_task("jsonl", str(tmp_path / "train_val"), eval_split=3)


def test_a_folder_with_only_train_jsonl_and_a_hub_snapshot_folder(tmp_path):
    import datasets

    only = tmp_path / "only"
    only.mkdir()
    (only / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    t = load_task("jsonl", str(only), eval_split=0.2)
    assert t.train == ROWS[:8] and t.test == ROWS[8:]
    snap = tmp_path / "snapshot"  # what `hf download --repo-type dataset` leaves: README, data/<split>-NNNNN-of-NNNNN
    (snap / "data").mkdir(parents=True)
    (snap / "README.md").write_text("---\nlicense: mit\n---\n")
    datasets.Dataset.from_list(ROWS[:6]).to_parquet(str(snap / "data" / "train-00000-of-00002.parquet"))
    datasets.Dataset.from_list(ROWS[6:8]).to_parquet(str(snap / "data" / "train-00001-of-00002.parquet"))
    datasets.Dataset.from_list(ROWS[8:]).to_parquet(str(snap / "data" / "test-00000-of-00001.parquet"))
    t = load_task("jsonl", str(snap))
    assert t.train == ROWS[:8] and t.test == ROWS[8:]  # shards in order, the snapshot's own test split
    # the same rows datasets.load_dataset gives for the folder
    ref = datasets.load_dataset(str(snap))
    assert ref["train"].to_list() == t.train and ref["test"].to_list() == t.test


def test_a_mistyped_local_path_is_reported_at_once_not_tried_on_the_hub(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text('{"prompt": "a"}\n')
    monkeypatch.chdir(tmp_path)
    import datasets

    def no_hub(*a, **kw):
        raise AssertionError("a local-looking path must not be tried on the Hub")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    with pytest.raises(DatasetError, match=r"dataset file not found: data/trian.jsonl \(in data: did you mean train.jsonl\?\)"):
        load_task("jsonl", "data/trian.jsonl")
    with pytest.raises(DatasetError, match="dataset file not found: data/nope.jsonl"):
        load_rows("data/nope.jsonl")
    with pytest.raises(DatasetError, match="dataset file not found: other/x.parquet"):  # no folder, but a file name
        load_rows("other/x.parquet")
