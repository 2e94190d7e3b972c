"""Issue 30, groups 2 and 8: dataset values reach the rewards as written, and bad dataset files are named with file
and line (CSV quotes and ragged rows, corrupt or empty Parquet, `.JSONL` in capitals, a huge prompt row)."""
import json
import logging

import pytest

from mmrl.data.loading import load_rows
from mmrl.data.tasks import load_task, read_rows
from mmrl.data.validate import MAX_PROMPT_CHARS, DataError


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------------------------ 2. values as written


def test_strings_of_a_mixed_column_stay_strings(tmp_path, caplog):
    rows = [{"prompt": "a", "puzzle": "0030100000020400", "flag": "true", "note": "null"},
            {"prompt": "b", "puzzle": 30, "flag": True, "note": None}]
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="mmrl.data.loading"):
        got = load_rows(path)
    # datasets gave 30 (leading zeros gone), True and None for the first row's strings
    assert got[0] == {"prompt": "a", "puzzle": "0030100000020400", "flag": "true", "note": "null"}
    assert got[1] == {"prompt": "b", "puzzle": "30", "flag": "true", "note": None}  # read as strings, as JSON spells them
    assert "'puzzle'" in caplog.text and "'flag'" in caplog.text and "mixed.jsonl" in caplog.text
    assert "'note'" not in caplog.text  # strings and nulls are not a mix


def test_unmixed_columns_keep_their_json_types_and_missing_columns_are_none(tmp_path):
    rows = [{"prompt": "a", "n": 1, "x": 0.5, "ok": False, "nums": [1, 2]}, {"prompt": "b", "n": 2, "x": 2, "extra": "e"}]
    got = read_rows(write_jsonl(tmp_path / "typed.jsonl", rows))
    assert got == [{"prompt": "a", "n": 1, "x": 0.5, "ok": False, "nums": [1, 2], "extra": None},
                   {"prompt": "b", "n": 2, "x": 2, "ok": None, "nums": None, "extra": "e"}]
    assert type(got[1]["x"]) is int  # as written, not promoted to float


def test_the_reward_sees_the_strings_through_a_task(tmp_path):
    path = write_jsonl(tmp_path / "t.json", [])
    path.write_text(json.dumps([{"prompt": "p", "answer": "007"}, {"prompt": "q", "answer": 7}, {"prompt": "r", "answer": "007"}]))
    task = load_task("jsonl", str(path))
    assert [r["answer"] for r in task.train + task.test] == ["007", "7", "007"]


# ------------------------------------------------------------------------------------ 8. files named with line


def test_an_unterminated_csv_quote_is_named_not_merged(tmp_path):
    (tmp_path / "q.csv").write_text('prompt,answer\n"one,1\ntwo,2\nthree,3\n')
    with pytest.raises(DataError, match=r"q\.csv:2: .*quote opened on line 2 is never closed"):
        read_rows(tmp_path / "q.csv")
    (tmp_path / "ok.csv").write_text('prompt,answer\n"multi\nline, quoted",1\ntwo,2\n')  # a closed multi-line field is fine
    assert read_rows(tmp_path / "ok.csv") == [{"prompt": "multi\nline, quoted", "answer": "1"}, {"prompt": "two", "answer": "2"}]


def test_a_ragged_csv_row_is_named_by_line(tmp_path):
    (tmp_path / "r.csv").write_text("prompt,answer\na,1\nb,2,extra\n")
    with pytest.raises(DataError, match=r"r\.csv:3: 3 fields where the header has 2"):
        read_rows(tmp_path / "r.csv")


def test_corrupt_and_empty_parquet_files_are_named(tmp_path):
    import datasets

    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(DataError, match=r"bad\.parquet: not a readable Parquet file"):
        read_rows(tmp_path / "bad.parquet")
    datasets.Dataset.from_dict({"prompt": []}, features=datasets.Features({"prompt": datasets.Value("string")})
                               ).to_parquet(str(tmp_path / "empty.parquet"))
    with pytest.raises(DataError, match=r"empty\.parquet: no rows"):
        read_rows(tmp_path / "empty.parquet")


@pytest.mark.parametrize("name", ["BAD.JSONL", "bad.Jsonl"])
def test_jsonl_in_any_case_gets_the_line_numbered_check(tmp_path, name):
    (tmp_path / name).write_bytes(b'{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(DataError, match=rf"{name}:2:\d+: not valid JSON"):
        read_rows(tmp_path / name)


def test_a_huge_prompt_row_is_named(tmp_path):
    rows = [{"prompt": "hi"}] * 3 + [{"prompt": "x" * (MAX_PROMPT_CHARS + 1)}]
    with pytest.raises(DataError, match=rf"huge\.jsonl: row 3: the prompt holds {MAX_PROMPT_CHARS + 1:,} characters"):
        read_rows(write_jsonl(tmp_path / "huge.jsonl", rows))
    chat = [{"prompt": [{"role": "user", "content": "y" * (MAX_PROMPT_CHARS + 1)}]}]
    with pytest.raises(DataError, match=r"row 0: the prompt holds"):
        read_rows(write_jsonl(tmp_path / "chat.jsonl", chat))


def test_resume_refuses_a_dataset_whose_content_changed(tmp_path, monkeypatch):
    import mmrl.training.trainer as trainer_mod
    from mmrl.config.train_config import ConfigError, load_config
    from mmrl.models import adapter_class
    from mmrl.training.trainer import Trainer
    from tiny_world_fixtures import dataset_for, vowel_reward

    values = dict(method="grpo", family="causal_lm", num_generations=4, per_device_train_batch_size=8,
                  max_completion_length=8, progress_bar=False, report_to=["jsonl"], save_steps=1,
                  output_dir=str(tmp_path / "run"), model_name_or_path="tiny")
    rows = [dict(r) for r in dataset_for("causal_lm")]
    Trainer(load_config(None, {**values, "max_steps": 1}), policy=adapter_class("causal_lm").tiny(seed=0), dataset=rows,
            reward_funcs=[vowel_reward]).train()
    changed = [dict(r) for r in rows]
    changed[3]["prompt"] = changed[3]["prompt"] + " (edited)"
    monkeypatch.setattr(trainer_mod, "build_policy", lambda *a, **k: pytest.fail("the model was loaded"))
    resume = load_config(None, {**values, "max_steps": 2, "resume_from": "auto"})
    with pytest.raises(ConfigError, match=r"the training dataset's content changed since it was written"):
        Trainer(resume, dataset=changed, reward_funcs=[vowel_reward])
    monkeypatch.undo()
    t = Trainer(resume, policy=adapter_class("causal_lm").tiny(seed=0), dataset=[dict(r) for r in rows], reward_funcs=[vowel_reward])
    t.train()  # the same rows resume
    assert t.step == 2
