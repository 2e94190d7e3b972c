"""Crash safety: training processes SIGKILLed at random points (named fault points during the rollout, inside the
optimizer step, between checkpoint files, during checkpoint rotation, and timers at random times) always leave a
loadable latest checkpoint that lost at most the steps since it; resuming (and being killed again) ends with the
same metrics, weights and optimizer state, bitwise, as an uninterrupted run.

The jobs run in forked children of `tests/helpers/crash_runner.py` (one interpreter start for all of them), which
report the fault points they pass: a timer starts at the fault point just before its instant in the reference run, so
it lands at the same place whatever the machine's speed or load and the step the run resumed from. The kill plan is
random; its seed is printed in every failure message and can be replayed with `MMRL_CRASH_SEED=<seed>` (the instants
timers land at still vary by a few milliseconds).
"""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mmrl.checkpointing.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint, load_model_weights
from mmrl.reporting.metrics_log import read_metrics
from mmrl.models import adapter_class

HERE = Path(__file__).resolve().parents[1]  # tests/
MAX_STEPS = 6
BASE = dict(method="grpo", family="causal_lm", max_steps=MAX_STEPS, num_generations=4, per_device_train_batch_size=4,
            gradient_accumulation_steps=2, learning_rate=1e-2, max_completion_length=8, num_iterations=2, save_steps=1,
            save_total_limit=2, progress_bar=False, dynamic_sampling=False, lr_scheduler_type="linear", seed=3,
            report_to=["jsonl"])
ROLLOUT_STEPS = [k for k in range(1, MAX_STEPS + 1) if (k - 1) % BASE["num_iterations"] == 0]  # steps that sample
# where the latest checkpoint must be after a kill at <point>:K: K - 1 before checkpoint K is in place, K after
CHECKPOINT_AFTER_KILL = {"during_rollout": -1, "in_optimizer_step": -1, "checkpoint/model": -1, "checkpoint/optimizer": -1,
                         "checkpoint/state": -1, "checkpoint/renamed": 0, "checkpoint/rotating": 0, "after_step": 0}
# kinds of kill: named fault points (`named_point`) and timers at a random instant (`timer_kill`)
KILL_KINDS = ("during_rollout", "in_optimizer_step", "checkpoint", "rotating", "after_step", "timer")
PLANNED_TRIALS = 10  # random kill plans of 1-2 kills each (`kill_plan`)
REQUIRED_KILLS = 10  # kills that must land (a timer can come after its run ended: then more trials, up to MAX_TRIALS)
MAX_TRIALS = 20


class Runner:
    def __init__(self, log: Path):
        self.err = open(log, "w")
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        self.proc = subprocess.Popen([sys.executable, str(HERE / "helpers" / "crash_runner.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True, env=env)
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}

    def job(self, values: dict, kill_at: str | None = None, kill_after: float | None = None,
            kill_from: str | None = None) -> dict:
        """One run; killed at fault point `kill_at`, or `kill_after` seconds after it passed fault point `kill_from`
        (None: after its start). Returns rc, wall and the fault points it passed (`crash_runner.py`)."""
        env = {"MMRL_KILL_AT": kill_at} if kill_at else {}
        self.proc.stdin.write(json.dumps({"values": values, "env": env, "kill_after": kill_after, "kill_from": kill_from}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.err.close()


def ckpt_step(path: Path | None) -> int:
    return 0 if path is None else load_checkpoint(path)["state"]["step"]


def assert_loadable(path: Path, why: str) -> None:
    """Every file of the checkpoint reads back, and its weights fit a fresh model of the same architecture."""
    ck = load_checkpoint(path)
    assert path.name == f"checkpoint-{ck['state']['step']:06d}", why
    assert ck["optimizer"]["state"] and ck["scheduler"] and ck["rng"] is not None and ck["buffer"] is not None, why
    load_model_weights(adapter_class("causal_lm").tiny(seed=1).model, path / "model")


def final_state(run: Path) -> tuple[dict, dict]:
    ck = latest_checkpoint(run)
    weights = {}
    for f in sorted((ck / "model").glob("*.safetensors")):
        weights.update(load_file(f))
    return weights, load_checkpoint(ck)["optimizer"]


def comparable(records: list[dict]) -> dict[int, dict]:
    """Per step, every metric except timings and memory (which differ between runs by nature)."""
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith("perf/")} for r in records}


def point_step(event: str) -> tuple[str, int]:
    point, k = event.rsplit(":", 1)
    return point, int(k)


def kill_plan(rng: random.Random, n: int) -> list[list[str]]:
    """n trials, each a list of 1-2 kills: named points at random steps or 'timer'; every kind of kill occurs."""
    kinds = list(KILL_KINDS) + ["timer"]
    kinds += [rng.choice(kinds) for _ in range(n - len(kinds))]
    rng.shuffle(kinds)
    return [[k] + ([rng.choice(["timer", "in_optimizer_step", "checkpoint"])] if rng.random() < 0.4 else []) for k in kinds]


def named_point(kind: str, done: int, rng: random.Random) -> str | None:
    """A fault point `point:K` that this run will reach (K after the step it resumes from), or None if none is left."""
    later = range(done + 1, MAX_STEPS + 1)
    if kind == "during_rollout":
        steps, point = [k for k in ROLLOUT_STEPS if k > done], kind
    elif kind == "checkpoint":
        steps, point = list(later), rng.choice(["checkpoint/model", "checkpoint/optimizer", "checkpoint/state", "checkpoint/renamed"])
    elif kind == "rotating":  # rotation starts once save_total_limit checkpoints exist
        steps, point = [k for k in later if k > BASE["save_total_limit"]], "checkpoint/rotating"
    else:
        steps, point = [k for k in later if k < MAX_STEPS], kind
    return f"{point}:{rng.choice(steps)}" if steps else None


def timer_kill(ref: dict, done: int, rng: random.Random) -> tuple[str | None, float]:
    """A random instant, uniform in time, of what is left of the reference run after step `done`, as (the fault
    point the reference passed just before it, seconds after that point); None: seconds after the job's start (the
    run's start-up, and its first step up to its first fault point). Timed from the run's own progress, the kill lands
    at the same place in a run resumed from `done` however fast or loaded the machine is; only an instant in the last
    stretch (after the last step, while the final model is written) can come after a faster run has ended."""
    events = ref["events"]  # [[point:K, seconds], ...] in order
    ends = [t for _, t in events[1:]] + [ref["wall"]]
    stretches = [(None, events[0][1])] + [(e, end - t) for (e, t), end in zip(events, ends) if point_step(e)[1] > done]
    x = rng.uniform(0, sum(length for _, length in stretches))
    for gate, length in stretches:
        if x < length:
            break
        x -= length
    return gate, min(x, length)


def checkpoint_after_timer(events: list, done: int) -> set[int]:
    """The steps the latest checkpoint may be at after a kill at any instant after the run passed `events` (the last
    fault point names the step in progress and how far its checkpoint got; no event: still starting up)."""
    if not events:
        return {done}
    point, k = point_step(events[-1][0])
    return {k + CHECKPOINT_AFTER_KILL[point]} | ({k} if point == "checkpoint/state" else set())  # renamed right after


def test_random_sigkills_never_lose_a_checkpoint_and_resume_exactly(tmp_path):
    seed = int(os.environ.get("MMRL_CRASH_SEED", random.SystemRandom().randrange(2**32)))
    print(f"kill plan seed {seed}; replay with MMRL_CRASH_SEED={seed}")  # shown with a failure's captured output
    rng = random.Random(seed)
    runner = Runner(tmp_path / "jobs.log")
    try:
        ref_dir = tmp_path / "reference"
        ref = runner.job({**BASE, "output_dir": str(ref_dir)})
        assert ref["rc"] == 0, (tmp_path / "jobs.log").read_text()[-3000:]
        assert ref["events"] and point_step(ref["events"][-1][0]) == ("after_step", MAX_STEPS), ref["events"]
        ref_metrics = comparable(read_metrics(ref_dir))
        assert sorted(ref_metrics) == list(range(1, MAX_STEPS + 1))
        ref_weights, ref_optim = final_state(ref_dir)
        kills, landed, log = 0, set(), []
        plans = kill_plan(rng, PLANNED_TRIALS)
        trial = 0
        # the planned trials; then, while kills are short (a timer that came after its run ended) or a kind of kill
        # has not landed, one-kill trials of the missing kinds: the test always ends with >= REQUIRED_KILLS kills
        while trial < len(plans) or ((kills < REQUIRED_KILLS or landed < set(KILL_KINDS)) and trial < MAX_TRIALS):
            missing = [k for k in KILL_KINDS if k not in landed]
            plan = plans[trial] if trial < len(plans) else [missing[0] if missing else rng.choice(KILL_KINDS)]
            run = tmp_path / f"trial{trial}"
            values = {**BASE, "output_dir": str(run)}
            for kind in plan:
                done = ckpt_step(latest_checkpoint(run))
                if kind == "timer":
                    kill_at, (kill_from, delay) = None, timer_kill(ref, done, rng)
                else:
                    (kill_at, kill_from), delay = (named_point(kind, done, rng), None), None
                    if kill_at is None:
                        continue
                out = runner.job({**values, **({"resume_from": "auto"} if done else {})}, kill_at=kill_at,
                                 kill_after=delay, kill_from=kill_from)
                passed = out["events"]
                how = kill_at or f"timer {delay:.3f}s after {kill_from or 'start'}"
                what = (f"seed {seed}, trial {trial}, kill {how} "
                        f"(resumed from step {done}; last fault point passed: {passed[-1][0] if passed else None})")
                log.append(f"{what}: rc {out['rc']}")
                if out["rc"] == 0:  # a timer in the last stretch that came after the run ended
                    assert kill_at is None, what
                    break
                assert out["rc"] == -9, (what, (tmp_path / "jobs.log").read_text()[-3000:])
                kills += 1
                landed.add(kind)
                latest = latest_checkpoint(run)
                after = ckpt_step(latest)
                if kill_at is not None:
                    point, k = point_step(kill_at)
                    assert passed and passed[-1][0] == kill_at, (what, passed[-3:])  # killed there, not elsewhere
                    assert after == k + CHECKPOINT_AFTER_KILL[point], (what, after)
                else:  # at most the step in progress is lost: the checkpoint is the last or second-to-last logged step
                    logged = max([r["step"] for r in read_metrics(run)], default=0)
                    assert after in (logged, max(0, logged - 1)) and after >= done, (what, after, logged)
                    assert after in checkpoint_after_timer(passed, done), (what, after)
                if latest is not None:
                    assert_loadable(latest, what)
                    assert all(p.name.startswith("checkpoint-") for p in list_checkpoints(run)), what
            else:
                out = runner.job({**values, "resume_from": "auto"})
                assert out["rc"] == 0, (seed, trial, (tmp_path / "jobs.log").read_text()[-3000:])
            # the interrupted run ends exactly where the uninterrupted one does
            assert comparable(read_metrics(run)) == ref_metrics, (seed, trial, log)
            weights, optim = final_state(run)
            assert weights.keys() == ref_weights.keys()
            for name in weights:
                assert torch.equal(weights[name], ref_weights[name]), (seed, trial, name)
            for pid, st in ref_optim["state"].items():
                for key, tensor in st.items():
                    assert torch.equal(optim["state"][pid][key], tensor), (seed, trial, pid, key)
            leftovers = [p.name for p in (run / "checkpoints").iterdir() if not p.name.startswith("checkpoint-")]
            assert not leftovers, (seed, trial, leftovers)  # temporary and trash directories are cleaned up
            trial += 1
        assert kills >= REQUIRED_KILLS and landed == set(KILL_KINDS), (
            f"seed {seed}: {kills} kills landed in {trial} trials (kinds {sorted(landed)}); replay with "
            f"MMRL_CRASH_SEED={seed}", log)
        print(f"{kills} kills landed in {trial} trials:", *log, sep="\n  ")
    finally:
        runner.close()


def test_timer_kills_are_placed_by_the_reference_runs_fault_points():
    """`timer_kill` picks an instant uniformly in time among the stretches a run resumed from `done` still has (its
    start-up, then the reference's stretches after fault points of later steps); `checkpoint_after_timer` names the
    checkpoint a kill after the last fault point passed must leave."""
    ref = {"events": [["during_rollout:1", 0.4], ["after_step:1", 1.0], ["in_optimizer_step:2", 1.2],
                      ["after_step:2", 1.5]], "wall": 1.6}
    # done=1: start-up 0.4 s, after in_optimizer_step:2 0.3 s, after after_step:2 (the final save) 0.1 s
    picks = [timer_kill(ref, 1, random.Random(s)) for s in range(400)]
    assert {gate for gate, _ in picks} == {None, "in_optimizer_step:2", "after_step:2"}
    for gate, limit, share in ((None, 0.4, 0.5), ("in_optimizer_step:2", 0.3, 0.375), ("after_step:2", 0.1, 0.125)):
        offsets = [x for g, x in picks if g == gate]
        assert all(0 <= x <= limit for x in offsets) and abs(len(offsets) / 400 - share) < 0.08, (gate, len(offsets))
    assert checkpoint_after_timer([], 3) == {3}
    assert checkpoint_after_timer([["during_rollout:5", 0.1]], 4) == {4}
    assert checkpoint_after_timer([["checkpoint/model:5", 0.1]], 4) == {4}
    assert checkpoint_after_timer([["checkpoint/state:5", 0.1]], 4) == {4, 5}  # the rename follows the last file
    assert checkpoint_after_timer([["checkpoint/rotating:5", 0.1]], 4) == {5}
    assert checkpoint_after_timer([["after_step:5", 0.1]], 4) == {5}


def test_partial_metric_line_from_a_kill_is_dropped_on_resume(tmp_path):
    from mmrl.reporting.metrics_log import MetricLogger

    lines = [json.dumps({"step": s, "loss": 0.1 * s}) for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 4, "lo')  # killed mid-write
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    MetricLogger(tmp_path, ["jsonl"], resume_step=2).log(3, {"loss": 9.0})
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 0.1}, {"step": 2, "loss": 0.2}, {"step": 3, "loss": 9.0}]


def test_a_resave_killed_between_its_two_renames_keeps_the_step(tmp_path):
    """`save_checkpoint` of a step that exists moves the old copy aside, then renames the new one in: a kill in
    between leaves only `.old-checkpoint-<step>-<pid>`, which stands in for that step until it is superseded."""
    from mmrl.checkpointing.checkpoint import save_checkpoint

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)

    def save(step, keep=1):
        return save_checkpoint(tmp_path, step, save_model=lambda p: p.mkdir(), optimizer=opt, scheduler=sched, buffer=None,
                               state={"step": step}, keep=keep)

    save(1)
    ck = save(2)
    ck.rename(ck.parent / ".old-checkpoint-000002-4242")  # the state a kill between the renames leaves
    assert [p.name for p in list_checkpoints(tmp_path)] == [".old-checkpoint-000002-4242"]
    assert load_checkpoint(latest_checkpoint(tmp_path))["state"]["step"] == 2
    save(2)  # the resumed run saves step 2 again: the stand-in is superseded and removed
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint-000002"]
    save(3)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-000003"]


def test_fresh_run_refuses_a_directory_with_checkpoints(tmp_path):
    """Starting over in a run directory without resume_from would rotate out the new run's checkpoints (their step
    numbers are older) and reset the metric log: it fails before any model is loaded."""
    from mmrl.config.train_config import load_config
    from mmrl.training.trainer import Trainer, TrainingError

    (tmp_path / "checkpoints" / "checkpoint-000007").mkdir(parents=True)
    (tmp_path / "checkpoints" / "checkpoint-000007" / "trainer_state.json").write_text("{}")
    cfg = load_config(None, {**BASE, "output_dir": str(tmp_path), "model_name_or_path": str(tmp_path / "missing-model")})
    with pytest.raises(TrainingError, match=r"already holds checkpoints of a run \(latest: checkpoint-000007\); resume it with resume_from=auto"):
        Trainer(cfg, dataset=[{"prompt": "a"}], reward_funcs=[lambda prompts, completions, **kw: [0.0] * len(completions)])


def test_disk_full_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path):
    import errno

    from mmrl.checkpointing.checkpoint import remove_stale, save_checkpoint

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)

    def save(step, save_model):
        return save_checkpoint(tmp_path, step, save_model=save_model, optimizer=opt, scheduler=sched, buffer=None,
                               state={"step": step}, keep=2)

    def full_disk(path):
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    save(1, lambda p: p.mkdir())
    with pytest.raises(OSError, match="No space left on device"):
        save(2, full_disk)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-000001"]
    assert load_checkpoint(latest_checkpoint(tmp_path))["state"]["step"] == 1
    remove_stale(tmp_path)  # what a resume does: the partial directory goes
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint-000001"]
