"""`mmrl geneval`: prompts, generate, evaluate, summary (a faithful, CPU-capable GenEval).

    mmrl geneval prompts -o prompts                        # the official 553 records
    mmrl geneval prompts -o shapes --vocabulary shapes     # a new suite, official rules, the tiny world's shapes
    mmrl geneval generate --family janus --model DIR --outdir images
    mmrl geneval generate META --model SD_DIR --n_samples 4 --steps 50 --scale 9.0   # diffusers_generate.py's flags
    mmrl geneval evaluate images --outfile results.jsonl --detector precomputed --detections dets.jsonl
    mmrl geneval summary results.jsonl --json

The official scripts' flag spellings and defaults are accepted (docs/geneval.md, "The official scripts' command lines").
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mmrl.geneval.detectors import detector_names
from mmrl.geneval.generate import OFFICIAL_NEGATIVE_PROMPT
from mmrl.geneval.rules import option_names


OFFICIAL_SUITE = (43, 100, 4)
"""create_prompts.py's seed, prompts per task and largest count: with these the shipped 553 records are written."""


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="geneval_command", metavar="SUBCOMMAND")

    p = sub.add_parser("prompts", help="write the official metadata, or generate a new suite with the official rules")
    p.add_argument("-o", "--output-path", "--outdir", dest="outdir", default="prompts",
                   help="output folder (evaluation_metadata.jsonl, generation_prompts.txt)")
    p.add_argument("--vocabulary", default=None,
                   help="generate a suite over 'coco', 'shapes' or a file of class names (omit: the official 553 records)")
    p.add_argument("--seed", type=int, default=43, help="generator seed (official: 43)")
    p.add_argument("-n", "--num-prompts", type=int, default=100, help="draws per task (official: 100)")
    p.add_argument("--max-count", type=int, default=4, help="largest count of the counting task (official: 4)")
    p.add_argument("--colors", default=None, help="comma-separated colour names (default: the vocabulary's)")

    g = sub.add_parser("generate", help="sample images from an image policy or a diffusers pipeline in GenEval's folder "
                                         "layout (the official diffusers_generate.py flags)")
    g.add_argument("metadata_file", nargs="?", default=None,
                   help="metadata JSONL, as the official script takes it (default: the official 553 records)")
    g.add_argument("--metadata", default=None, help="the same, as an option")
    g.add_argument("--model", default=None,
                   help="local folder: a diffusers pipeline (model_index.json) or an mmrl image model (never downloaded)")
    g.add_argument("--family", default=None,
                   help="model family (default: from the folder: 'diffusers' for a pipeline, else its config), or "
                        "'shapes-oracle' (a perfect shapes renderer)")
    g.add_argument("--outdir", default="outputs", help="output folder (official default: outputs): "
                                                       "<outdir>/<NNNNN>/metadata.jsonl + samples/<k>.png + grid.png")
    g.add_argument("--n_samples", "--n-samples", dest="n_samples", type=int, default=4, help="images per prompt (official: 4)")
    g.add_argument("--batch_size", "--batch-size", dest="batch_size", type=int, default=1,
                   help="images per sampling call (official meaning; several prompts share a call when it exceeds --n_samples)")
    g.add_argument("--steps", type=int, default=None, help="denoising steps (diffusers: official default 50; "
                                                           "masked_image: num_steps)")
    g.add_argument("--scale", type=float, default=None, help="guidance scale (diffusers: official default 9.0; mmrl "
                                                             "families: cfg_scale)")
    g.add_argument("--negative-prompt", "--negative_prompt", dest="negative_prompt", nargs="?", default=None,
                   const=OFFICIAL_NEGATIVE_PROMPT, help="negative prompt (alone: the official default list)")
    g.add_argument("--H", type=int, default=None, help="image height in pixels (diffusers pipelines)")
    g.add_argument("--W", type=int, default=None, help="image width in pixels (diffusers pipelines)")
    g.add_argument("--seed", type=int, default=42, help="seed (official: 42; diffusers: every prompt reseeded with it, as "
                                                        "the official script does; mmrl families: seed + prompt index)")
    g.add_argument("--skip_grid", "--skip-grid", dest="skip_grid", action="store_true", help="do not save grid.png")
    g.add_argument("--device", default=None)
    g.add_argument("--trust-remote-code", action="store_true", help="allow remote code when loading the policy")
    g.add_argument("--gen", nargs="*", default=[], metavar="KEY=VALUE",
                   help="other generation options (policy.sample's, or the pipeline's call arguments)")
    g.add_argument("--limit", type=int, default=None, help="only the first N records")
    g.add_argument("--skip-existing", "--skip_existing", dest="skip_existing", action="store_true",
                   help="keep prompt folders that already hold n_samples images")

    e = sub.add_parser("evaluate", help="score generated images; writes results.jsonl with the official keys")
    e.add_argument("imagedir", help="folder of <NNNNN>/metadata.jsonl + samples/<k>.png")
    e.add_argument("--outfile", default="results.jsonl")
    e.add_argument("--detector", default="mmdet", choices=detector_names(),
                   help="detector backend (default: mmdet, the official Mask2Former, as evaluate_images.py)")
    e.add_argument("--detections", default=None, help="precomputed: the detections JSONL file")
    e.add_argument("--model-path", "--model_path", dest="model_path", default=None,
                   help="hf: model directory; mmdet: folder of <model>.pth (official default ./)")
    e.add_argument("--model-config", "--model_config", dest="model_config", default=None,
                   help="mmdet: the detector config file")
    e.add_argument("--clip-weights", default=None,
                   help="local open_clip weights of the colour classifier for option clip_model (an architecture name; "
                        "clip_model=local-dir:DIR needs no weights file)")
    e.add_argument("--vocabulary", default=None, help="hf/mmdet: class names ('coco' default, 'shapes' or a file)")
    e.add_argument("--grid", type=int, default=None, help="shapes: cells per side (default 12)")
    e.add_argument("--device", default=None)
    e.add_argument("--batch-size", type=int, default=8)
    e.add_argument("--options", nargs="*", default=[], metavar="KEY=VALUE",
                   help=f"official options: {', '.join(option_names())}")
    e.add_argument("--quiet", action="store_true", help="no progress bar")

    s = sub.add_parser("summary", help="the official summary of a results.jsonl")
    s.add_argument("results")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.set_defaults(_geneval_parser=parser)


def run(args: argparse.Namespace) -> int:
    cmd = getattr(args, "geneval_command", None)
    if cmd is None:
        args._geneval_parser.print_help()
        return 2
    try:
        return {"prompts": _prompts, "generate": _generate, "evaluate": _evaluate, "summary": _summary}[cmd](args)
    except (ValueError, FileNotFoundError, ImportError) as e:
        print(f"mmrl geneval {cmd}: error: {e}", file=sys.stderr)
        return 2


def _prompts(args) -> int:
    from mmrl.geneval import prompts

    vocab = args.vocabulary
    if vocab is None and (args.seed, args.num_prompts, args.max_count) != OFFICIAL_SUITE:
        vocab = "coco"  # create_prompts.py with another seed or -n: a new suite over GenEval's 80 classes
    if vocab is None:
        if args.colors is not None:
            raise ValueError("--colors applies to a generated suite: give --vocabulary too")
        records = prompts.official_metadata()
    else:
        names, colors = prompts.vocabulary(vocab, _worlds())
        if args.colors:
            colors = [c.strip() for c in args.colors.split(",") if c.strip()]
        records = prompts.generate_suite(args.seed, args.num_prompts, names, colors, args.max_count)
    meta, _ = prompts.write_suite(records, args.outdir)
    tags: dict[str, int] = {}
    for r in records:
        tags[r["tag"]] = tags.get(r["tag"], 0) + 1
    print(f"wrote {len(records)} records to {meta} ({', '.join(f'{k} {v}' for k, v in tags.items())})")
    return 0


def _parse_pairs(pairs, what: str) -> dict:
    out = {}
    for p in pairs:
        if "=" not in p:
            raise ValueError(f"{what} are given as key=value, got {p!r}")
        k, v = p.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def _generate(args) -> int:
    from tqdm.auto import tqdm

    from mmrl.geneval import generate as gen
    from mmrl.geneval import prompts

    if args.n_samples < 1 or args.batch_size < 1:
        raise ValueError(f"--n_samples and --batch_size must be >= 1, got {args.n_samples} and {args.batch_size}")
    if args.metadata_file and args.metadata and args.metadata_file != args.metadata:
        raise ValueError(f"two metadata files given: {args.metadata_file!r} and --metadata {args.metadata!r}")
    meta = args.metadata_file or args.metadata
    records = prompts.read_metadata(meta) if meta else prompts.official_metadata()
    if args.limit is not None:
        records = records[: args.limit]
    gen_options = _parse_pairs(args.gen, "generation options")
    family = args.family or _family_of(args.model)
    out = Path(args.outdir)
    todo = []
    for i, record in enumerate(records):
        have = [out / f"{i:05d}" / "samples" / f"{j:04d}.png" for j in range(args.n_samples)]
        if args.skip_existing and all(p.is_file() for p in have):
            continue
        todo.append((i, record))
    if family == gen.DIFFUSERS:
        draw = _diffusers_draw(args, gen_options)
    else:
        draw = _policy_draw(args, family, gen_options)
    bar = tqdm(total=len(todo) * args.n_samples, desc="geneval generate", unit="img", file=sys.stderr)
    for batch, images in draw(todo):
        for b, (i, record) in enumerate(batch):
            folder = out / f"{i:05d}"
            (folder / "samples").mkdir(parents=True, exist_ok=True)
            (folder / "metadata.jsonl").write_text(json.dumps(record) + "\n")
            mine = images[b * args.n_samples : (b + 1) * args.n_samples]
            for j, im in enumerate(mine):
                im.save(folder / "samples" / f"{j:04d}.png")
            if not args.skip_grid:
                gen.grid_image(mine, nrow=args.batch_size).save(folder / "grid.png")
        bar.update(len(batch) * args.n_samples)
    bar.close()
    print(f"wrote {len(todo) * args.n_samples} images for {len(todo)} prompts under {out}")
    return 0


def _family_of(model) -> str:
    """The family of `--model` when `--family` is not given: a diffusers pipeline, else the model's own."""
    from mmrl.geneval.generate import DIFFUSERS, is_diffusers_pipeline

    if not model:
        raise ValueError("--model (a local folder: a diffusers pipeline or an mmrl image model) is required, or "
                         "--family shapes-oracle")
    if not Path(model).is_dir():
        raise ValueError(f"--model {model!r} is not a local folder; weights are never downloaded at run time: download "
                         "the model once (e.g. `huggingface-cli download ID --local-dir DIR`) and pass DIR")
    if is_diffusers_pipeline(model):
        return DIFFUSERS
    from mmrl.training.trl_api import family_of_path

    return family_of_path(model)


def _diffusers_draw(args, gen_options):
    """Prompt by prompt, as the official script: every prompt reseeded with --seed, --batch_size images a call."""
    from mmrl.geneval.generate import OFFICIAL_SCALE, OFFICIAL_STEPS, DiffusersGenerator

    if not args.model:
        raise ValueError("--model (a local diffusers pipeline folder) is required for --family diffusers")
    g = DiffusersGenerator(args.model, device=args.device)
    g.check_options(gen_options)
    steps = OFFICIAL_STEPS if args.steps is None else args.steps
    scale = OFFICIAL_SCALE if args.scale is None else args.scale
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")

    def draw(todo):
        for i, record in todo:
            yield [(i, record)], g.generate(record["prompt"], args.n_samples, args.batch_size, seed=args.seed,
                                            steps=steps, scale=scale, height=args.H, width=args.W,
                                            negative_prompt=args.negative_prompt, **gen_options)
    return draw


def _policy_draw(args, family, gen_options):
    """An mmrl image policy: --batch_size images a call (whole prompts; a prompt's --n_samples split over calls when
    they are more), a generator seeded with seed + the first prompt's index per call group."""
    from PIL import Image

    from mmrl.geneval.generate import family_options

    if family == "shapes-oracle":
        from mmrl.tiny_world.shapes import OraclePolicy

        policy, names = OraclePolicy(seed=args.seed), ()
        if any(v is not None for v in (args.steps, args.scale, args.negative_prompt, args.H, args.W)):
            raise ValueError("--steps / --scale / --negative-prompt / --H / --W do not apply to the shapes oracle")
    else:
        if not args.model:
            raise ValueError(f"--model (a local checkpoint directory) is required for family {family!r}")
        from mmrl.models import adapter_class, load_policy

        names = adapter_class(family).generation_option_names
        gen_options = {**gen_options, **family_options(family, names, steps=args.steps, scale=args.scale,
                                                       negative_prompt=args.negative_prompt, height=args.H, width=args.W)}
        load_opts = {}
        if args.device:
            load_opts["device"] = args.device
        if args.trust_remote_code:
            load_opts["trust_remote_code"] = True
        policy = load_policy(family, args.model, **load_opts)

    import torch

    per_call = max(1, args.batch_size // args.n_samples)  # whole prompts a call
    chunk = min(args.batch_size, args.n_samples)  # images of one prompt a call

    def draw(todo):
        for start in range(0, len(todo), per_call):
            batch = todo[start : start + per_call]
            generator = torch.Generator().manual_seed(args.seed + batch[0][0])
            if len(batch) > 1 or chunk == args.n_samples:
                calls = [(batch, args.n_samples)]
            else:
                calls = [(batch, min(chunk, args.n_samples - k)) for k in range(0, args.n_samples, chunk)]
            images: list = []
            for prompts_of_call, group in calls:
                rollout = policy.sample([r["prompt"] for _, r in prompts_of_call], group_size=group,
                                        generator=generator, **gen_options)
                got = list(rollout.completions)
                if len(got) != len(prompts_of_call) * group or not all(isinstance(im, Image.Image) for im in got):
                    kinds = sorted({type(im).__name__ for im in got})
                    raise ValueError(f"policy {family!r} returned {len(got)} completions of type(s) {kinds}; "
                                     f"generate needs {len(prompts_of_call) * group} PIL images (an image policy)")
                images.extend(got)
            yield batch, images
    return draw


def _evaluate(args) -> int:
    from mmrl.geneval.detectors import build_detector
    from mmrl.geneval.rules import Options
    from mmrl.geneval.scoring import evaluate_folder, write_results
    from mmrl.geneval.summary import summarize

    options = Options.parse(args.options)
    if args.detector != "precomputed" and args.detections:
        raise ValueError("--detections is only used by --detector precomputed")
    vocabulary = None
    if args.vocabulary:
        from mmrl.geneval.prompts import vocabulary as named_vocabulary

        vocabulary = named_vocabulary(args.vocabulary, _worlds())[0]
    detector = build_detector(
        args.detector, detections=args.detections, model_path=args.model_path, model_config=args.model_config,
        model=options.model, device=args.device, grid=args.grid, vocabulary=vocabulary,
    )
    classify = None
    if args.clip_weights or options.clip_model.startswith("local-dir:"):
        from mmrl.geneval.colors import ClipColorClassifier

        classify = ClipColorClassifier(options.clip_model, args.clip_weights, bgcolor=options.bgcolor, crop=options.crop,
                                       device=args.device or "cpu")
    rows = evaluate_folder(args.imagedir, detector, options, classify, batch_size=args.batch_size, progress=not args.quiet)
    write_results(rows, args.outfile)
    s = summarize(rows)
    errors = f", {s['errors']} with errors" if s["errors"] else ""
    print(f"wrote {len(rows)} results to {args.outfile}: {s['correct_images']:.2%} correct images, overall {s['overall']:.5f}{errors}")
    unused = sorted(set(getattr(detector, "table", {})) - getattr(detector, "used", set()))
    if unused:
        print(f"warning: {len(unused)} detections lines name images outside {args.imagedir}, e.g. {unused[0]!r}", file=sys.stderr)
    if rows.ignored:
        print(f"warning: {len(rows.ignored)} image files are not named <digits>.png and were not scored (the official "
              f"script skips them too), e.g. {rows.ignored[0]!r}", file=sys.stderr)
    for path, reason in rows.skipped:
        print(f"mmrl geneval evaluate: error: prompt folder skipped, not scored: {reason}", file=sys.stderr)
    if rows.skipped:  # the score above leaves these prompts out: not a complete evaluation
        print(f"mmrl geneval evaluate: error: {len(rows.skipped)} prompt folder(s) could not be scored; the results "
              "above cover the others only", file=sys.stderr)
        return 2
    return 0


def _summary(args) -> int:
    from mmrl.geneval.summary import format_summary, read_results, summarize

    s = summarize(read_results(args.results))
    print(json.dumps(s, indent=2) if args.json else format_summary(s))
    return 0


def _worlds() -> dict:
    """The vocabularies of the worlds this command knows besides COCO: the tiny world's shapes."""
    from mmrl.tiny_world.shapes import COLORS, SHAPE_NAMES

    return {"shapes": (SHAPE_NAMES, COLORS)}
