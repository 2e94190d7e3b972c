"""`mmrl geneval`: prompts, generate, evaluate, summary (a faithful, CPU-capable GenEval).

    mmrl geneval prompts -o prompts                        # the official 553 records
    mmrl geneval prompts -o shapes --vocabulary shapes     # a new suite, official rules, the tiny world's shapes
    mmrl geneval generate --family janus --model DIR --outdir images
    mmrl geneval evaluate images --outfile results.jsonl --detector precomputed --detections dets.jsonl
    mmrl geneval summary results.jsonl --json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mmrl.geneval.detectors import detector_names
from mmrl.geneval.rules import option_names


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="geneval_command", metavar="SUBCOMMAND")

    p = sub.add_parser("prompts", help="write the official metadata, or generate a new suite with the official rules")
    p.add_argument("-o", "--outdir", default="prompts", help="output folder (evaluation_metadata.jsonl, generation_prompts.txt)")
    p.add_argument("--vocabulary", default=None,
                   help="generate a suite over 'coco', 'shapes' or a file of class names (omit: the official 553 records)")
    p.add_argument("--seed", type=int, default=43, help="generator seed (official: 43)")
    p.add_argument("-n", "--num-prompts", type=int, default=100, help="draws per task (official: 100)")
    p.add_argument("--max-count", type=int, default=4, help="largest count of the counting task (official: 4)")
    p.add_argument("--colors", default=None, help="comma-separated colour names (default: the vocabulary's)")

    g = sub.add_parser("generate", help="sample images from an image policy in GenEval's folder layout")
    g.add_argument("--family", required=True, help="model family (e.g. janus), or 'shapes-oracle' (a perfect shapes renderer)")
    g.add_argument("--model", default=None, help="local checkpoint directory of the policy")
    g.add_argument("--metadata", default=None, help="metadata JSONL (default: the official 553 records)")
    g.add_argument("--outdir", required=True, help="output folder: <outdir>/<NNNNN>/metadata.jsonl + samples/<k>.png")
    g.add_argument("--n-samples", type=int, default=4, help="images per prompt (official: 4)")
    g.add_argument("--batch-size", type=int, default=1, help="prompts per sampling call")
    g.add_argument("--seed", type=int, default=42)
    g.add_argument("--device", default=None)
    g.add_argument("--trust-remote-code", action="store_true", help="allow remote code when loading the policy")
    g.add_argument("--gen", nargs="*", default=[], metavar="KEY=VALUE", help="generation options for policy.sample")
    g.add_argument("--limit", type=int, default=None, help="only the first N records")
    g.add_argument("--skip-existing", action="store_true", help="keep prompt folders that already hold n-samples images")

    e = sub.add_parser("evaluate", help="score generated images; writes results.jsonl with the official keys")
    e.add_argument("imagedir", help="folder of <NNNNN>/metadata.jsonl + samples/<k>.png")
    e.add_argument("--outfile", default="results.jsonl")
    e.add_argument("--detector", required=True, choices=detector_names(), help="detector backend")
    e.add_argument("--detections", default=None, help="precomputed: the detections JSONL file")
    e.add_argument("--model-path", default=None, help="hf: model directory; mmdet: folder of <model>.pth")
    e.add_argument("--model-config", default=None, help="mmdet: the detector config file")
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

    if args.vocabulary is None:
        if args.colors is not None:
            raise ValueError("--colors applies to a generated suite: give --vocabulary too")
        records = prompts.official_metadata()
    else:
        names, colors = prompts.vocabulary(args.vocabulary, _worlds())
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
    from PIL import Image
    from tqdm.auto import tqdm

    from mmrl.geneval import prompts

    if args.n_samples < 1 or args.batch_size < 1:
        raise ValueError(f"--n-samples and --batch-size must be >= 1, got {args.n_samples} and {args.batch_size}")
    records = prompts.read_metadata(args.metadata) if args.metadata else prompts.official_metadata()
    if args.limit is not None:
        records = records[: args.limit]
    gen_options = _parse_pairs(args.gen, "generation options")
    if args.family == "shapes-oracle":
        from mmrl.tiny_world.shapes import OraclePolicy

        policy = OraclePolicy(seed=args.seed)
    else:
        if not args.model:
            raise ValueError(f"--model (a local checkpoint directory) is required for family {args.family!r}")
        from mmrl.models import load_policy

        load_opts = {}
        if args.device:
            load_opts["device"] = args.device
        if args.trust_remote_code:
            load_opts["trust_remote_code"] = True
        policy = load_policy(args.family, args.model, **load_opts)

    import torch

    out = Path(args.outdir)
    todo = []
    for i, record in enumerate(records):
        folder = out / f"{i:05d}"
        have = [folder / "samples" / f"{j:04d}.png" for j in range(args.n_samples)]
        if args.skip_existing and all(p.is_file() for p in have):
            continue
        todo.append((i, record))
    bar = tqdm(total=len(todo) * args.n_samples, desc="geneval generate", unit="img", file=sys.stderr)
    for start in range(0, len(todo), args.batch_size):
        batch = todo[start : start + args.batch_size]
        generator = torch.Generator().manual_seed(args.seed + batch[0][0])
        rollout = policy.sample([r["prompt"] for _, r in batch], group_size=args.n_samples, generator=generator, **gen_options)
        images = list(rollout.completions)
        if len(images) != len(batch) * args.n_samples or not all(isinstance(im, Image.Image) for im in images):
            kinds = sorted({type(im).__name__ for im in images})
            raise ValueError(f"policy {args.family!r} returned {len(images)} completions of type(s) {kinds}; "
                             f"generate needs {len(batch) * args.n_samples} PIL images (an image policy)")
        for b, (i, record) in enumerate(batch):
            folder = out / f"{i:05d}"
            (folder / "samples").mkdir(parents=True, exist_ok=True)
            (folder / "metadata.jsonl").write_text(json.dumps(record) + "\n")
            for j in range(args.n_samples):
                images[b * args.n_samples + j].save(folder / "samples" / f"{j:04d}.png")
        bar.update(len(batch) * args.n_samples)
    bar.close()
    print(f"wrote {len(todo) * args.n_samples} images for {len(todo)} prompts under {out}")
    return 0


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
