"""Study (docs/RESULTS.md, "RL on a Sudoku base with headroom"): the validation pilots of `sudoku_rl_pilot.py` in
one table, one JSON and one plot.

    python scripts/studies/sudoku_rl_pilot_report.py PILOT_DIR OUT_DIR

Reads every PILOT_DIR/*/curve.json; writes OUT_DIR/pilots.json (per pilot: its settings, every validation point with
per-puzzle scores and the paired interval of its gain over the base, the training reward and KL per step),
OUT_DIR/pilots.md (gain over the base by rollout batch; * where the 95% interval excludes 0) and OUT_DIR/pilots.png.
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mmrl.tiny_world.report import markdown_table  # noqa: E402


def label(rec: dict) -> str:
    """A pilot's settings in words: arm, lr, the config overrides beyond the comparison's, the reward control."""
    cfg = rec["config"]
    extra = "" if cfg.get("gradient_accumulation_steps", 1) == 1 else \
        f", {cfg['per_device_train_batch_size'] * cfg['gradient_accumulation_steps'] // cfg['num_generations']} puzzles x {cfg['num_generations']} per step"
    control = ", random reward (control)" if rec.get("random_reward") else ""
    seed = f", seed {rec['seed']}" if rec.get("seed") else ""
    return f"{rec['arm']}, lr {cfg['learning_rate']:g}{extra}, {rec['rollouts']}-batch schedule{control}{seed}"


def main() -> None:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    recs = [json.loads(p.read_text()) for p in sorted(src.glob("*/curve.json"))]
    recs = [r for r in recs if r["rollouts"] >= 10]  # plumbing checks (a few batches) left out
    recs.sort(key=lambda r: (bool(r.get("random_reward")), r["config"].get("gradient_accumulation_steps", 1), r["arm"],
                             -r["config"]["learning_rate"], r["rollouts"], r.get("seed", 0)))
    marks = sorted({p["rollouts"] for r in recs for p in r["points"][1:]})
    rows, keep = [], []
    fig, ax = plt.subplots(figsize=(9, 5))
    for r in recs:
        pts = {p["rollouts"]: p for p in r["points"][1:]}
        cells = []
        for m in marks:
            g = pts[m]["gain"] if m in pts else None
            cells.append("-" if g is None else f"{100 * g['estimate']:+.1f}" + ("*" if g["low"] > 0 or g["high"] < 0 else ""))
        rows.append([label(r), f"{100 * r['points'][0]['accuracy']:.1f}", *cells, f"{r['seconds']:.0f}"])
        xs = [0] + [p["rollouts"] for p in r["points"][1:]]
        ax.plot(xs, [0.0] + [100 * p["gain"]["estimate"] for p in r["points"][1:]], marker="o", ms=3, label=label(r),
                linestyle="--" if r.get("random_reward") else "-")
        steps = [m for m in r["metrics"] if "reward" in m]
        keep.append({k: r.get(k, False) for k in ("name", "arm", "base", "seed", "rollouts", "random_reward", "seconds", "config", "points")}
                    | {"reward": [m["reward"] for m in steps], "kl": [m.get("kl") for m in steps]})
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xlabel("rollout batches")
    ax.set_ylabel("validation cell accuracy - base (points)")
    ax.set_title("Sudoku RL pilots on sudoku4-mid (256 validation puzzles)")
    ax.legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    fig.savefig(out / "pilots.png", dpi=120)
    table = markdown_table(["pilot (seed 0 unless named)", "base, validation (%)", *[f"{m} batches" for m in marks], "s"], rows)
    (out / "pilots.md").write_text(table + "\n\nGain over the base in validation cell-accuracy points (paired over the 256 "
                                   "validation puzzles); * where the 95% interval excludes 0.\n")
    (out / "pilots.json").write_text(json.dumps(keep))
    print(table)


if __name__ == "__main__":
    main()
