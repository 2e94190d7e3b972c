"""`mmrl eval` on a GenEval task: n images per prompt, per-task accuracy and the overall mean over tasks."""
import argparse
import json
from types import SimpleNamespace

from mmrl.tiny_world.shapes import COLORS, SHAPE_NAMES, OraclePolicy, Scene
from mmrl.data.tasks import load_task
from mmrl.cli.eval import _geneval_eval, is_geneval
from mmrl.geneval.prompts import parse_prompt


class HalfOracle(OraclePolicy):
    """Draws a right scene for single_object and colors prompts and for every other image of counting, an empty
    canvas otherwise: per-task accuracies 1, 0, 0.5, 1, 0, 0 by construction."""

    def sample(self, prompts, group_size, **kw):
        out = super().sample(prompts, group_size, **kw)
        images = []
        for i, (p, img) in enumerate(zip(out.prompts, out.completions)):
            tag = parse_prompt(p, SHAPE_NAMES, COLORS)["tag"]
            seed = kw["seeds"][i]
            good = tag in ("single_object", "colors") or (tag == "counting" and seed % 2 == 0)
            images.append(img if good else Scene([], self.grid).render(self.cell_px))
        return SimpleNamespace(completions=images, prompts=out.prompts, group_size=group_size)


def test_eval_samples_n_images_per_prompt_and_reports_the_mean_over_tasks(tmp_path, capsys):
    import mmrl.tiny_world

    mmrl.tiny_world.register()
    task = load_task("shapes")
    by_tag = {}
    for r in task.test:
        by_tag.setdefault(r["metadata"]["tag"], []).append(r)
    rows = [r for rs in by_tag.values() for r in rs[:2]]  # 2 prompts of each of the six tasks
    assert is_geneval(rows, "geneval")
    args = argparse.Namespace(n_samples=4, batch_size=8, out=str(tmp_path / "r.json"))
    assert _geneval_eval(HalfOracle(grid=16, cell_px=6), rows, "geneval", "shapes", args) == 0
    res = json.loads((tmp_path / "r.json").read_text())
    assert res["n_samples"] == 4 and len(res["images"]) == 4 * len(rows)
    tasks = res["summary"]["tasks"]
    assert {t: v["accuracy"] for t, v in tasks.items()} == {
        "single_object": 1.0, "two_object": 0.0, "counting": 0.5, "colors": 1.0, "position": 0.0, "color_attr": 0.0}
    assert all(v["total"] == 8 for v in tasks.values())  # 2 prompts x 4 images per task
    assert res["summary"]["overall"] == 2.5 / 6
    printed = capsys.readouterr().out
    assert "Task breakdown" in printed and "GenEval overall 0.4167 (mean over 6 tasks" in printed
