"""Prompt sets ("tasks"): training and test rows, default rewards, and the evaluation metric.

A row is `{"prompt": ..., <columns the rewards read>}`; the trainer repeats each row G times and passes the
columns to the rewards as keyword arguments (TRL's convention). Tasks are chosen by name (`load_task`); each loader
reads local files (`dataset_path`) or bundled data, and falls back to the Hugging Face Hub through `datasets` only
for public prompt sets when no local path is given (never model weights).

Prompt wording follows d1's format (a system instruction asking for `<reasoning>...</reasoning>` then
`<answer>...</answer>`, dllm-reasoning/d1 `data_utils.py`; docs/sources.md "d1 / diffu-GRPO"), written here in
our own words; the rewards parse the same tags. Prompts are conversational, as d1's and DMPO's: one user message in
TRL's format (`[{"role": "user", "content": ...}]`), so every family renders them with the model's chat template
(`mmrl.models.prompts.render_chat`). `d1_eval_prompt` adds d1's pre-filled `<reasoning>` assistant turn.
"""
from __future__ import annotations

import inspect
import logging
import random
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from mmrl.core.registry import TASKS
from mmrl.data.loading import (EVAL_SPLITS, FILE_BUILDERS, DatasetError, holdout, hub_rows, is_saved_dataset, load_rows, local_splits,
                               require_column)

logger = logging.getLogger(__name__)

FORMAT_INSTRUCTION = "Respond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n"
"""d1's answer format (the GSM8K, MATH, Countdown and Sudoku rewards read the `<answer>` tag)."""


REASONING_PREFILL = "<reasoning>"
"""d1's and DMPO's evaluation pre-fill the assistant turn with this after the chat template (`add_reasoning=True`;
authors' code: dllm-reasoning/d1 eval/gsm8k.py)."""


def user_message(text: str) -> list[dict]:
    """A conversational prompt of one user message (TRL's format)."""
    return [{"role": "user", "content": text}]


def d1_eval_prompt(prompt):
    """d1's evaluation prompt: a conversational prompt followed by the pre-filled assistant text `<reasoning>`
    (the adapters continue a final assistant message); other prompts are returned unchanged."""
    if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt) and prompt[-1].get("role") != "assistant":
        return [*prompt, {"role": "assistant", "content": REASONING_PREFILL}]
    return prompt


@dataclass
class Task:
    """A prompt set with its rewards."""

    name: str
    """Registry name."""
    train: list[dict]
    """Training rows: `{"prompt": ..., **reward columns}`."""
    test: list[dict]
    """Held-out rows, same schema (never overlapping `train` by construction of each loader). Evaluated once per
    reported run, never for a choice (the tiny world's comparisons; `validation` is for choices)."""
    reward_funcs: list[str]
    """Default training rewards (names in `mmrl.rewards.REWARDS`)."""
    metric: str
    """The reward whose mean over the test rows is the task's accuracy (`mmrl eval`): 1 for a correct answer and 0
    otherwise, as the authors' `parse_and_get_acc` (Sudoku: the fraction of blank cells filled correctly, which
    `evaluate` aggregates over all cells); training rewards keep their own scales."""
    family: str = "causal_lm"
    """The family the prompts are written for (text tasks fit causal_lm, vlm and masked_diffusion)."""
    info: dict = field(default_factory=dict)
    """Free-form facts about the split (sizes, sources)."""
    eval_prompt: Callable[[dict], Any] | None = None
    """The authors' evaluation prompt of a test row (d1's / DMPO's `eval/*.py` instructions, which ask for the final
    answer in `\\boxed{}`, in mmrl's words), used by `mmrl eval --protocol d1|dmpo`; None = the row's own prompt."""
    validation: list[dict] = field(default_factory=list)
    """Rows for training curves, early stopping and every recipe or base choice: disjoint from `train` and `test`
    and held out the same way as `test` (the tiny world's tasks); empty for tasks that only ship train / test
    (the trainer's curves then fall back to `test`)."""


def load_task(name: str, dataset_path: str | None = None, *, seed: int = 0, **options) -> Task:
    """The task `name` from `mmrl.core.registry.TASKS` (unknown names raise and list the valid ones; the tiny world's
    tasks are there after `mmrl.tiny_world.register()`). `options` (e.g. `eval_split`) go to the loaders that take
    them. Tasks that generate their own data refuse a `dataset_path` rather than ignore it."""
    loader = TASKS[name]
    if dataset_path is not None and getattr(loader, "generates_data", False):
        raise DatasetError(f"task {name!r} generates its own data and does not read dataset_path={dataset_path!r}; remove "
                         "dataset_path, or train on your file with task=jsonl (rows of {\"prompt\": ..., <reward columns>})")
    accepted = inspect.signature(loader).parameters
    return loader(dataset_path, seed, **{k: v for k, v in options.items() if k in accepted})


def bundled(relpath: str) -> Path:
    """Path of a data file shipped inside `mmrl.data`."""
    return Path(str(resources.files("mmrl.data").joinpath(relpath)))


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a JSONL, JSON (list), CSV or Parquet file, or of a saved `datasets` directory (`mmrl.data.loading`:
    local files are validated first, and empty files, malformed lines, ragged or unterminated CSV, non-UTF-8 bytes
    and rows that are not objects raise `DataError` naming the file and line, `mmrl.data.validate`)."""
    return load_rows(Path(path))


def _split_rows(dataset_path: str | None, name: str) -> tuple[list[dict], list[dict]] | None:
    """(train, test) rows of a local dataset directory: `<dir>/train.<ext>` and `<dir>/test.<ext>` files, or a
    DatasetDict with train and test splits written by `save_to_disk`; None without a dataset_path."""
    if dataset_path is None:
        return None
    d = Path(dataset_path)
    if d.is_file():
        raise DatasetError(f"{name}: dataset_path {d} is a file; this task needs a directory with train and test files")
    splits = local_splits(d)
    if "train" not in splits:
        raise DatasetError(f"{name}: {d} has no train split (splits: {sorted(splits)})")
    test = next((splits[s] for s in EVAL_SPLITS if s in splits), None)
    if test is None:
        raise DatasetError(f"{name}: {d} has a train split but no test or validation split")
    return splits["train"], test


def _hub_rows(repo: str, config: str | None, split: str) -> list[dict]:
    return hub_rows(repo, config, split)


# ------------------------------------------------------------------------------------------------- GSM8K, MATH


EVAL_FORMAT_INSTRUCTION = ("Solve the problem step by step and give the final answer in \\boxed{}. Respond in the following "
                           "format:\n<reasoning>\n...\n</reasoning>\n<answer>\n\\boxed{...}\n</answer>")
"""d1's / DMPO's GSM8K and MATH evaluation instruction (eval/gsm8k.py, eval/math500.py), in mmrl's words."""


def boxed_eval_prompt(row: dict) -> list[dict]:
    """The GSM8K / MATH evaluation prompt of a row with a `question` column."""
    return user_message(f"{EVAL_FORMAT_INSTRUCTION}\n\n{row['question']}")


def gsm8k_prompt(question: str) -> list[dict]:
    return user_message(f"{FORMAT_INSTRUCTION}\n{question.strip()}")


@TASKS.register("gsm8k")
def _gsm8k(dataset_path: str | None, seed: int) -> Task:
    train, test = _split_rows(dataset_path, "gsm8k") or (_hub_rows("openai/gsm8k", "main", "train"), _hub_rows("openai/gsm8k", "main", "test"))
    conv = lambda r: {"prompt": gsm8k_prompt(r["question"]), "answer": r["answer"], "question": r["question"]}  # noqa: E731
    return Task("gsm8k", [conv(r) for r in train], [conv(r) for r in test], ["gsm8k"], "gsm8k_accuracy",
                eval_prompt=boxed_eval_prompt)


def math_prompt(problem: str) -> list[dict]:
    return user_message(f"{FORMAT_INSTRUCTION}\nPut the final answer inside \\boxed{{}} within the <answer> tag.\n\n{problem.strip()}")


@TASKS.register("math500")
def _math500(dataset_path: str | None, seed: int) -> Task:
    split = _split_rows(dataset_path, "math500")
    if split:
        train, test = split
    else:
        train, test = _hub_rows("ankner/math-500", None, "train"), _hub_rows("HuggingFaceH4/MATH-500", None, "test")

    def conv(r):
        return {"prompt": math_prompt(r["problem"]), "answer": r.get("solution") or r["answer"], "question": r["problem"]}

    return Task("math500", [conv(r) for r in train], [conv(r) for r in test], ["math500"], "math500_accuracy",
                eval_prompt=boxed_eval_prompt)


# --------------------------------------------------------------------------------------------- Countdown, Sudoku


def countdown_prompt(numbers: list[int], target: int) -> list[dict]:
    return user_message(f"{FORMAT_INSTRUCTION}\nUsing only the numbers {numbers}, each exactly once, and the operations + - * /, "
                        f"write an expression that equals {target}. Put only the expression inside the <answer> tag.")


def countdown_eval_prompt(row: dict) -> list[dict]:
    """d1's / DMPO's Countdown evaluation prompt (eval/countdown.py: the expression in `\\boxed{}`, then
    "Numbers: [...]" and "Target: ..."), in mmrl's words."""
    return user_message("Write an arithmetic expression that equals the target number, using each given number exactly "
                        "once and the operations + - * /. Reason step by step, then give only the expression inside "
                        "\\boxed{}, without an equals sign or the target, e.g. \\boxed{a + b * c}.\n\n"
                        f"Numbers: {list(row['numbers'])}\nTarget: {row['target']}")


def countdown_row(numbers: list[int], target: int) -> dict:
    return {"prompt": countdown_prompt(numbers, target), "numbers": list(numbers), "target": int(target)}


def d1_countdown_test() -> list[dict]:
    """d1's 256 three-number Countdown test problems (bundled)."""
    rows = read_rows(bundled("d1/countdown_cd3_test.jsonl"))
    return [countdown_row([int(x) for x in r["input"].split(",")], int(r["output"])) for r in rows]


@TASKS.register("countdown")
def _countdown(dataset_path: str | None, seed: int) -> Task:
    test = d1_countdown_test()
    if dataset_path:
        rows = read_rows(dataset_path)
        train = [countdown_row(r["nums"] if "nums" in r else r["numbers"], r["target"]) for r in rows]
    else:
        rows = _hub_rows("Jiayi-Pan/Countdown-Tasks-3to4", None, "train")
        rows = [r for r in rows if len(r["nums"]) == 3]
        random.Random(seed).shuffle(rows)
        train = [countdown_row(r["nums"], r["target"]) for r in rows[:-500]]  # d1 holds out the last 500
    test_keys = {(tuple(sorted(r["numbers"])), r["target"]) for r in test}
    train = [r for r in train if (tuple(sorted(r["numbers"])), r["target"]) not in test_keys]
    return Task("countdown", train, test, ["countdown"], "countdown_accuracy", eval_prompt=countdown_eval_prompt)


SUDOKU_RULES = ("Solve this 4x4 Sudoku. The puzzle is given as 16 digits read row by row, 0 marks an empty cell. Fill the "
                "empty cells with 1-4 so that every row, column and 2x2 box contains 1, 2, 3 and 4 once. Put the 16 digits "
                "of the solved grid inside the <answer> tag.")


def sudoku_row(puzzle: str, solution: str) -> dict:
    return {"prompt": user_message(f"{FORMAT_INSTRUCTION}\n{SUDOKU_RULES}\n\nPuzzle: {puzzle}"), "puzzle": puzzle, "solution": solution}


def d1_sudoku_test(n: int | None = None, seed: int = 42) -> list[dict]:
    """d1's 4x4 Sudoku test set (500 puzzles); with `n`, the n rows d1's and DMPO's evaluation draw: numpy's
    `choice(500, n, replace=False)` right after `np.random.seed(seed)` (authors' code: dllm-reasoning/d1
    eval/gsm8k.py `subsample`, eval/eval.py `init_seed(42)`), in that order."""
    rows = [sudoku_row(r["Puzzle"], r["Solution"]) for r in read_rows(bundled("d1/4x4_test_sudoku.csv"))]
    if n is not None:
        import numpy as np

        rows = [rows[int(i)] for i in np.random.RandomState(seed).choice(len(rows), n, replace=False)]
    return rows


@TASKS.register("sudoku")
def _sudoku(dataset_path: str | None, seed: int) -> Task:
    test = d1_sudoku_test()
    if dataset_path is None:
        raise FileNotFoundError(
            "sudoku: pass dataset_path=<CSV with Puzzle,Solution columns> for training (d1 uses "
            "4x4_sudoku_unique_puzzles.csv), or use the tiny-world task sudoku4, which generates its own puzzles"
        )
    train = [sudoku_row(r["Puzzle"], r["Solution"]) for r in read_rows(dataset_path)]
    test_puzzles = {r["puzzle"] for r in test}
    train = [r for r in train if r["puzzle"] not in test_puzzles]
    return Task("sudoku", train, test, ["sudoku"], "sudoku")


# ------------------------------------------------------------------------------------------------------ GenEval


@TASKS.register("geneval")
def _geneval(dataset_path: str | None, seed: int, geneval_train_on_eval_prompts: bool = False) -> Task:
    """GenEval: test = the 553 official evaluation prompts; train = prompts none of which is a test prompt.

    Without dataset_path the training rows are `mmrl.geneval.prompts.training_suite()`: the official generator's
    rules with other seeds, every evaluation prompt removed (3543 prompts). A dataset_path is a metadata JSONL of
    training prompts (e.g. Flow-GRPO's `dataset/geneval/train_metadata.jsonl`, which GCPO's T2I launch trains on);
    one that holds any of the 553 is refused unless `geneval_train_on_eval_prompts=True` (the config field of the
    same name), since a GenEval score after training on its own prompts is a train-set score."""
    from mmrl.geneval.prompts import official_metadata, overlap_with_evaluation, read_metadata, training_suite

    test = [{"prompt": m["prompt"], "metadata": m} for m in official_metadata()]
    records = read_metadata(dataset_path) if dataset_path else training_suite()
    shared = overlap_with_evaluation(records)
    if shared and not geneval_train_on_eval_prompts:
        raise DatasetError(
            f"geneval: dataset_path={dataset_path!r} holds {len(shared)} of the 553 GenEval evaluation prompts (first: "
            f"{shared[0]!r}); remove them, omit dataset_path to train on the generated training suite, or set "
            "geneval_train_on_eval_prompts=true to train on them knowingly (the GenEval score is then a train-set score)")
    train = [{"prompt": m["prompt"], "metadata": m} for m in records]
    info = {"train_source": dataset_path or "mmrl.geneval.prompts.training_suite()", "train_eval_overlap": len(shared)}
    return Task("geneval", train, test, ["geneval"], "geneval_strict", family="janus", info=info)


@TASKS.register("jsonl")
def _jsonl(dataset_path: str | None, seed: int, eval_split: float | int = 0.0) -> Task:
    """Your own rows: `{"prompt": ..., <reward columns>}` in a JSON/JSONL/CSV/Parquet file, a saved `datasets`
    directory, a directory with train/test files, or (online) a Hub dataset name (`mmrl.data.loading`).

    `images` (or `image`) columns holding file paths are opened as PIL images (VLM prompts then become
    `{"prompt": ..., "images": [...]}`). With a single source, `eval_split` rows (a count, or a fraction) at its end
    are held out as the test split, and the count is printed; 0 (the default) trains on every row.
    """
    if dataset_path is None:
        raise DatasetError("task 'jsonl' needs dataset_path=<data file, saved dataset, directory with train/test files or Hub name>")
    path = Path(dataset_path)
    if path.exists():
        splits = local_splits(path)  # every layout datasets.load_dataset reads (local files validated first)
    else:
        splits = {"train": read_rows(dataset_path)}  # a Hub name (online), or a missing path reported at once
    if "train" not in splits:
        raise DatasetError(f"jsonl: {dataset_path} has no train split (splits: {sorted(splits)})")
    own_test = next((s for s in EVAL_SPLITS if s in splits), None)
    rows = splits["train"]
    require_column(rows, "prompt", str(dataset_path))
    if own_test is not None and eval_split:
        raise DatasetError(f"jsonl: {dataset_path} has its own {own_test} split; eval_split={eval_split} holds rows out only "
                           "of a train-only dataset (set eval_split=0)")
    if own_test is not None:
        train, test = rows, splits[own_test]
    else:
        train, test = holdout(rows, eval_split)
        if test:
            logger.info(f"task 'jsonl': holding out the last {len(test)} of {len(rows)} rows of {dataset_path} as the test split "
                  f"(eval_split={eval_split})")
    require_column(train, "prompt", str(dataset_path))
    base = path if path.is_dir() else path.parent

    def conv(r: dict) -> dict:
        r = dict(r)
        imgs = r.pop("images", None) or ([r.pop("image")] if r.get("image") else None)
        if imgs:
            from PIL import Image

            r["prompt"] = {"prompt": r["prompt"], "images": [Image.open(base / p).convert("RGB") if isinstance(p, str) else p for p in imgs]}
        return r

    return Task("jsonl", [conv(r) for r in train], [conv(r) for r in test], ["boxed_accuracy"], "boxed_accuracy")


def task_names() -> list[str]:
    return sorted(TASKS)


Loader = Callable[[str | None, int], Task]
