"""`mmrl geneval` with the official GenEval scripts' command lines (djghosh13/geneval `prompts/create_prompts.py`,
`generation/diffusers_generate.py`, `evaluation/evaluate_images.py`, `evaluation/summary_scores.py`): their flag
spellings, defaults and meanings, a diffusers pipeline as the generator. The command runs in process
(`mmrl.cli.main(argv)`, the console script's function): tests/geneval/test_geneval_cli.py runs it as a subprocess."""
import argparse
import contextlib
import importlib.util
import io
import json

import numpy as np
import pytest
from PIL import Image

from mmrl.geneval.generate import GRID_PADDING, OFFICIAL_NEGATIVE_PROMPT, grid_image
from tiny_vision import tiny_stable_diffusion_dir

RECORDS = [
    {"tag": "single_object", "include": [{"class": "square", "count": 1}], "prompt": "a photo of a red square"},
    {"tag": "single_object", "include": [{"class": "circle", "count": 1}], "prompt": "a photo of a blue circle"},
]


@pytest.fixture(autouse=True)
def _outside_the_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the official default --outdir is ./outputs


def mmrl(*args, check=True):
    """`mmrl ARGS` in process: (exit status, stdout, stderr)."""
    from mmrl.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:  # argparse's own errors
            code = e.code
    if check and code != 0:
        raise AssertionError(f"mmrl {' '.join(map(str, args))} failed ({code}):\n{out.getvalue()}\n{err.getvalue()}")
    return code, out.getvalue(), err.getvalue()


def fails(*args):
    code, _, err = mmrl(*args, check=False)
    assert code == 2 and "Traceback" not in err, (code, err)
    return err


def write_meta(path):
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


def pixels(path):
    return np.asarray(Image.open(path).convert("RGB"), dtype=np.int16)


def test_the_official_generate_command_line_with_a_diffusers_pipeline(tmp_path):
    """diffusers_generate.py's flags, unchanged: positional metadata file, --model, --n_samples, --batch_size, --steps,
    --scale, --H, --W, --seed; the images are the official script's (every prompt reseeded with --seed, --batch_size
    images a call), computed here by calling the pipeline as that script does; grid.png has --batch_size a row."""
    import torch
    from diffusers import DiffusionPipeline

    pipe_dir = tiny_stable_diffusion_dir(tmp_path / "sd")
    meta = write_meta(tmp_path / "evaluation_metadata.jsonl")
    mmrl("geneval", "generate", meta, "--model", pipe_dir, "--n_samples", "3", "--batch_size", "2", "--steps", "2",
         "--scale", "7.5", "--H", "16", "--W", "16", "--seed", "5")
    out = tmp_path / "outputs"  # the official default --outdir
    assert sorted(p.name for p in out.iterdir()) == ["00000", "00001"]
    assert sorted(p.name for p in (out / "00000").iterdir()) == ["grid.png", "metadata.jsonl", "samples"]
    assert sorted(p.name for p in (out / "00000/samples").iterdir()) == ["0000.png", "0001.png", "0002.png"]
    assert json.loads((out / "00001/metadata.jsonl").read_text()) == RECORDS[1]

    pipe = DiffusionPipeline.from_pretrained(pipe_dir, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    for i, record in enumerate(RECORDS):
        torch.manual_seed(5)  # the official seed_everything(opt.seed) before each prompt, global RNG
        ref = []
        for n in (2, 1):  # n_samples 3 in calls of batch_size 2
            ref += pipe(record["prompt"], height=16, width=16, num_inference_steps=2, guidance_scale=7.5,
                        num_images_per_prompt=n).images
        for k, im in enumerate(ref):
            got = pixels(out / f"{i:05d}/samples/{k:04d}.png")
            assert got.shape == (16, 16, 3)
            assert np.abs(got - np.asarray(im, dtype=np.int16)).max() <= 1  # PNG of the same float image
    # a prompt's images differ from one another (one generator through the calls), and another seed changes them
    a, b = pixels(out / "00000/samples/0000.png"), pixels(out / "00000/samples/0002.png")
    assert np.abs(a - b).max() > 8
    grid = Image.open(out / "00000/grid.png")
    cell = 16 + GRID_PADDING
    assert grid.size == (2 * cell + GRID_PADDING, 2 * cell + GRID_PADDING)  # 2 a row (--batch_size), 2 rows
    g = np.asarray(grid.convert("RGB"), dtype=np.int16)
    assert (g[GRID_PADDING:GRID_PADDING + 16, cell + GRID_PADDING:cell + GRID_PADDING + 16] == pixels(out / "00000/samples/0001.png")).all()
    assert (g[cell + GRID_PADDING:, cell:] == 0).all()  # the empty fourth cell stays black

    mmrl("geneval", "generate", meta, "--model", pipe_dir, "--outdir", tmp_path / "s6", "--n_samples", "1", "--steps", "2",
         "--H", "16", "--W", "16", "--seed", "6", "--skip_grid")
    assert not (tmp_path / "s6/00000/grid.png").exists()
    assert np.abs(pixels(tmp_path / "s6/00000/samples/0000.png") - a).max() > 8

    # bad inputs, one line each, before sampling
    assert "not a local folder" in fails("geneval", "generate", meta, "--model", "runwayml/stable-diffusion-v1-5")
    err = fails("geneval", "generate", meta, "--model", pipe_dir, "--steps", "1", "--gen", "bogus=1")
    assert "bogus" in err and "eta" in err  # names the pipeline's own call arguments
    assert "two metadata files" in fails("geneval", "generate", meta, "--metadata", tmp_path / "other.jsonl",
                                         "--model", pipe_dir)


def test_the_official_flags_on_an_mmrl_family(tmp_path):
    """--scale is the family's cfg_scale (the same images as --gen cfg_scale=3); the family comes from the folder when
    --family is not given; flags a family has no option for are refused by name; --batch_size is images a call."""
    from mmrl.models.janus import JanusAdapter

    JanusAdapter.tiny(grid=(12, 12), codebook_size=8, cell_px=8).save_pretrained(tmp_path / "janus")
    meta = write_meta(tmp_path / "m.jsonl")
    mmrl("geneval", "generate", meta, "--model", tmp_path / "janus", "--outdir", tmp_path / "a", "--n_samples", "2",
         "--batch_size", "2", "--scale", "3", "--skip_grid")
    mmrl("geneval", "generate", "--family", "janus", "--model", tmp_path / "janus", "--metadata", meta,
         "--outdir", tmp_path / "b", "--n-samples", "2", "--batch-size", "2", "--gen", "cfg_scale=3")
    for i in range(2):
        for k in range(2):
            assert (pixels(tmp_path / f"a/{i:05d}/samples/{k:04d}.png") == pixels(tmp_path / f"b/{i:05d}/samples/{k:04d}.png")).all()
    assert "--steps does not apply to family 'janus'" in fails("geneval", "generate", meta, "--model", tmp_path / "janus",
                                                             "--steps", "50")
    assert "--H / --W apply to diffusers pipelines" in fails("geneval", "generate", meta, "--model", tmp_path / "janus",
                                                            "--H", "512")
    # --batch_size 1 with 3 samples: three calls for the prompt, one generator through them; the grid is 1 a row
    mmrl("geneval", "generate", "--family", "shapes-oracle", meta, "--outdir", tmp_path / "o", "--n_samples", "3")
    assert sorted(p.name for p in (tmp_path / "o/00001/samples").iterdir()) == ["0000.png", "0001.png", "0002.png"]
    w, h = Image.open(tmp_path / "o/00001/samples/0000.png").size
    assert Image.open(tmp_path / "o/00001/grid.png").size == (w + 2 * GRID_PADDING, 3 * (h + GRID_PADDING) + GRID_PADDING)
    mmrl("geneval", "evaluate", tmp_path / "o", "--outfile", tmp_path / "r.jsonl", "--detector", "shapes")
    s = json.loads(mmrl("geneval", "summary", tmp_path / "r.jsonl", "--json")[1])
    assert s["images"] == 6 and s["overall"] == 1.0  # grid.png is not scored (it is outside samples/)


def test_negative_prompt_alone_is_the_official_default_list():
    from mmrl.cli.geneval import configure

    parser = argparse.ArgumentParser()
    configure(parser)
    assert parser.parse_args(["generate", "--negative-prompt"]).negative_prompt == OFFICIAL_NEGATIVE_PROMPT
    assert parser.parse_args(["generate", "--negative-prompt", "blurry"]).negative_prompt == "blurry"
    a = parser.parse_args(["generate"])
    assert (a.outdir, a.n_samples, a.batch_size, a.seed, a.negative_prompt) == ("outputs", 4, 1, 42, None)


def test_grid_image_layout():
    cells = [Image.new("RGB", (3, 2), (10 * k, 0, 0)) for k in range(1, 4)]
    g = np.asarray(grid_image(cells, nrow=2, padding=1))
    assert g.shape == (2 * 3 + 1, 2 * 4 + 1, 3)  # 2 rows of (2 + 1), 2 columns of (3 + 1), + 1
    assert g[1, 1, 0] == 10 and g[1, 5, 0] == 20 and g[4, 1, 0] == 30 and g[4, 5, 0] == 0 and g[0, 0, 0] == 0


@pytest.mark.skipif(importlib.util.find_spec("mmdet") is not None, reason="mmdet installed: the official detector runs")
def test_evaluate_without_detector_is_the_official_mmdet(tmp_path):
    """evaluate_images.py takes no detector flag: mmrl's default is the same Mask2Former through mmdet; without mmdet
    the one-line error says so and names the other backends."""
    meta = write_meta(tmp_path / "m.jsonl")
    mmrl("geneval", "generate", "--family", "shapes-oracle", meta, "--outdir", tmp_path / "img", "--n_samples", "1")
    err = fails("geneval", "evaluate", tmp_path / "img", "--outfile", tmp_path / "r.jsonl",
                "--model-config", tmp_path / "c.py", "--model-path", tmp_path)
    assert "mmdetection 2.x" in err and "hf, shapes, precomputed" in err and len(err.strip().splitlines()) == 1


def test_the_official_prompts_command_line(tmp_path):
    """create_prompts.py's --output-path; its --seed / -n without a vocabulary generate a new COCO suite (the shipped
    553 records only for the official seed 43 and -n 100)."""
    mmrl("geneval", "prompts", "--output-path", tmp_path / "p7", "--seed", "7", "-n", "5")
    mmrl("geneval", "prompts", "-o", tmp_path / "c7", "--vocabulary", "coco", "--seed", "7", "-n", "5")
    got = (tmp_path / "p7/evaluation_metadata.jsonl").read_text()
    assert got == (tmp_path / "c7/evaluation_metadata.jsonl").read_text()
    assert 80 < len(got.splitlines()) <= 80 + 5 * 5  # 80 single objects + 5 draws of each other task
    mmrl("geneval", "prompts", "--output-path", tmp_path / "p43")
    from mmrl.geneval.prompts import OFFICIAL_METADATA

    assert (tmp_path / "p43/evaluation_metadata.jsonl").read_text() == OFFICIAL_METADATA.read_text()
