"""The layering of docs/design.md holds: no import circles between files or between folders, every folder imports
only the layers below it, the trainer imports only its own room and the rooms the one step needs, the engine does
not import the tiny world, the trainer knows no method by name, and every repository path the code cites exists."""
import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"mmrl": ROOT / "mmrl", "mmrl.models": ROOT / "models", "mmrl.rewards": ROOT / "rewards"}
"""Import name -> folder on disk (pyproject.toml's package-dir)."""


def modules() -> dict[str, Path]:
    out = {}
    for pkg, folder in PACKAGES.items():
        for f in folder.rglob("*.py"):
            parts = list(f.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = f
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the mmrl modules it imports anywhere (module level or inside functions)."""
    mods = modules()
    graph = {}
    for name, f in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in mods]
                deps.update(subs if len(subs) == len(node.names) else [node.module, *subs])
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


LAYERS = [
    ["core"],
    ["algorithms"],
    ["models"],
    ["geneval"],
    ["rewards"],
    ["data", "methods", "reporting"],
    ["config"],
    ["checkpointing"],
    ["training"],
    ["tiny_world"],
    ["cli"],
]
"""The rooms from the ground floor up (docs/design.md, "Layers"): a room imports only rooms of lower layers (and
itself); rooms of one layer do not import each other."""
RANK = {room: i for i, layer in enumerate(LAYERS) for room in layer}
TRAINER_MAY_IMPORT = {"training", "methods", "core", "config", "checkpointing", "reporting"}
"""The trainer's rooms: models, rewards, data and the algorithm core reach it through its own room (policy factory,
reward inputs, datasets, advantages) or through the adapter and method hooks."""


def room(module: str) -> str:
    """`mmrl.training.trainer` -> `training`; `mmrl` (the package's entry points) -> `mmrl`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "mmrl"


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        out.setdefault(room(m), set()).update(room(d) for d in deps if room(d) != room(m))
    for deps in list(out.values()):
        for d in deps:
            out.setdefault(d, set())
    return out


def test_every_room_has_a_layer():
    rooms = set(room_graph(import_graph())) - {"mmrl"}
    assert rooms == set(RANK), sorted(rooms ^ set(RANK))


def test_no_import_circles_between_folders():
    assert cycles(room_graph(import_graph())) == []


def test_nothing_imports_upward():
    upward = sorted(f"{m} -> {d}" for m, deps in import_graph().items() for d in deps
                    if room(m) != "mmrl" and room(d) != room(m) and RANK[room(d)] >= RANK[room(m)])
    assert upward == []


def test_the_trainer_imports_only_its_rooms():
    deps = import_graph()["mmrl.training.trainer"]
    assert sorted(d for d in deps if room(d) not in TRAINER_MAY_IMPORT) == []


def test_layer_check_catches_an_upward_import():
    graph = {"mmrl.core.seeds": {"mmrl.training.trainer"}, "mmrl.training.trainer": set()}
    assert [f"{m} -> {d}" for m, deps in graph.items() for d in deps if RANK[room(d)] >= RANK[room(m)]] != []
    assert cycles(room_graph({"mmrl.a.x": {"mmrl.b.y"}, "mmrl.b.y": {"mmrl.a.z"}, "mmrl.a.z": set()})) == [["a", "b"]]


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles():
    assert cycles(import_graph()) == []


def test_the_engine_does_not_import_the_tiny_world():
    # the mmrl command is the application that registers it (mmrl.tiny_world.register)
    offenders = {m: sorted(d for d in deps if d.startswith("mmrl.tiny_world"))
                 for m, deps in import_graph().items() if not m.startswith("mmrl.tiny_world") and not m.startswith("mmrl.cli")}
    assert {m: d for m, d in offenders.items() if d} == {}


def test_tiny_world_is_registered_explicitly(tmp_path):
    code = """
import json, sys
import mmrl.training.trainer, mmrl.data.tasks, mmrl.training.policy_factory, mmrl.training.evaluate
from mmrl.config.train_config import load_config
out = {"imported": sorted(m for m in sys.modules if m.startswith("mmrl.tiny_world"))}
try:
    mmrl.data.tasks.load_task("sudoku4")
except ValueError as e:
    out["task"] = str(e)
cfg = load_config(None, {"method": "dmpo", "family": "masked_diffusion", "model_name_or_path": "tiny-world:sudoku4"})
try:
    mmrl.training.policy_factory.build_policy(cfg)
except ValueError as e:
    out["source"] = str(e)
import mmrl.tiny_world
mmrl.tiny_world.register()
out["registered"] = "sudoku4" in mmrl.data.tasks.task_names()
try:
    mmrl.training.policy_factory.build_policy(cfg)  # empty cache: an error, not a pre-training run
except FileNotFoundError as e:
    out["missing"] = str(e)
print(json.dumps(out))
"""
    env = {**os.environ, "MMRL_CACHE": str(tmp_path / "cache")}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=True)
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["imported"] == []
    assert "unknown task 'sudoku4'" in out["task"] and "mmrl.tiny_world.register()" in out["task"]
    assert "unknown model source 'tiny-world'" in out["source"] and "mmrl.tiny_world.register()" in out["source"]
    assert out["registered"] is True
    assert "not built yet" in out["missing"] and "mmrl pretrain-tiny sudoku4" in out["missing"]
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("tiny_spec.json"))


def test_trainer_knows_no_method_by_name():
    from mmrl.methods import METHODS
    from mmrl.models import FAMILIES

    src = (ROOT / "mmrl" / "training" / "trainer.py").read_text()
    assert "cfg.method ==" not in src and ".method in (" not in src
    quoted = [m for m in [*METHODS, *FAMILIES] if re.search(rf"[\"']{m}[\"']", src)]
    assert quoted == []


CITED = re.compile(r"(?<![\w/.-])((?:docs|mmrl|models|rewards|tests|scripts|benchmarks|configs)/[\w./-]*\.(?:md|py|yaml|json|sh|txt))\b")
"""A path inside the repository to a file (metric names such as `rewards/dropped_groups` have no extension; a folder
named `sudoku-rewards/` is not the `rewards/` folder, hence `-` in the look-behind)."""


NOT_ON_DISK = {"mmrl/models/base.py", "mmrl/rewards/combine.py"}
"""Paths docs/design.md and the strict-install test name to explain the import-path mapping (the installed layout,
not the repository's)."""


def test_every_cited_repository_path_exists():
    missing = []
    docs = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("configs/*.yaml")]
    for f in [*modules().values(), *ROOT.glob("tests/**/*.py"), *ROOT.glob("scripts/**/*.py"), *ROOT.glob("benchmarks/*.py"), *docs]:
        for path in CITED.findall(f.read_text()):
            if "/X." in path or path in NOT_ON_DISK:
                continue
            if not (ROOT / path).exists():
                missing.append(f"{f.relative_to(ROOT)}: {path}")
    assert missing == []


BARE_DOC = re.compile(r"(?<![\w/.-])([A-Za-z_][\w-]*\.md)\b")
"""A document cited by its file name alone (`design.md`, `README.md`): it must be the name of a document of the
repository."""
WRITTEN_DOCS = {"table.md"}
"""Documents the experiment scripts write into their output folders (not repository files)."""
OUTSIDE = {"DESIGN.md", "ALGORITHMS.md"}
"""The original design documents, named by the test below that looks for citations of them."""


def test_bare_document_names_are_repository_documents():
    names = {p.name for p in ROOT.rglob("*.md") if ".venv" not in p.parts and ".git" not in p.parts}
    missing = []
    docs = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("configs/*.yaml")]
    for f in [*modules().values(), *ROOT.glob("tests/**/*.py"), *ROOT.glob("scripts/**/*.py"), *ROOT.glob("benchmarks/*.py"), *docs]:
        if f.name == "test_architecture.py":
            continue  # its own test of the pattern names a missing document
        for name in BARE_DOC.findall(f.read_text()):
            if name not in names and name not in WRITTEN_DOCS and name not in OUTSIDE:
                missing.append(f"{f.relative_to(ROOT)}: {name}")
    assert missing == []


def test_bare_document_pattern_catches_a_missing_one():
    assert BARE_DOC.findall("(see `adapter_api.md`); docs/design.md") == ["adapter_api.md"]


def test_at_most_eight_modules_at_the_top_of_the_package():
    top = sorted(p.name for p in (ROOT / "mmrl").glob("*.py"))
    assert len(top) <= 8, top


def test_no_citation_of_documents_outside_the_repository():
    bad = []
    for f in [*modules().values(), *ROOT.glob("tests/**/*.py"), *ROOT.glob("scripts/**/*.py"), *ROOT.glob("benchmarks/*.py")]:
        if f.name == "test_architecture.py":
            continue  # names the documents it looks for
        text = f.read_text()
        for needle in ("DESIGN.md", "ALGORITHMS.md", "reference/", "../shared"):
            if needle in text:
                bad.append(f"{f.relative_to(ROOT)}: {needle}")
    assert bad == []


def test_import_paths_resolve_to_the_folders():
    code = ("import json, mmrl, mmrl.models.base, mmrl.rewards.combine, mmrl.methods; "
            "print(json.dumps([mmrl.__file__, mmrl.models.base.__file__, mmrl.rewards.combine.__file__]))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True, cwd="/")
    files = [Path(p).resolve() for p in json.loads(res.stdout.strip().splitlines()[-1])]
    assert files == [ROOT / "mmrl" / "__init__.py", ROOT / "models" / "base.py", ROOT / "rewards" / "combine.py"]
    out = subprocess.run([sys.executable, "-m", "mmrl.cli", "--version"], capture_output=True, text=True, timeout=120,
                         cwd="/")
    assert out.returncode == 0 and out.stdout.startswith("mmrl "), out


def test_tiny_model_factories_live_outside_the_adapters():
    # the production adapter classes carry no test-model factory; `Adapter.tiny` reaches mmrl.models.tiny_configs
    from mmrl.models import FAMILIES, adapter_class, tiny_policy

    for family in FAMILIES:
        cls = adapter_class(family)
        assert "tiny" not in vars(cls), family
        src = (ROOT / "models" / f"{cls.__module__.rsplit('.', 1)[-1]}.py").read_text()
        assert "def tiny(" not in src, family
    policy = tiny_policy("causal_lm", seed=0)
    assert type(policy) is adapter_class("causal_lm")
    same = adapter_class("causal_lm").tiny(seed=0)
    assert all(torch_equal(a, b) for a, b in zip(policy.model.parameters(), same.model.parameters()))


def torch_equal(a, b) -> bool:
    import torch

    return torch.equal(a, b)


def print_calls(source: str) -> list[int]:
    """Lines that call the builtin `print` (a method or attribute named print, or the word in a string, is not one)."""
    return [n.lineno for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"]


def test_print_finder_finds_a_print():
    src = 'def f(log):\n    log.print("a")\n    x = "print(1)"\n    if x:\n        print(x, file=None)\n'
    assert print_calls(src) == [5]


def test_no_print_in_library_code():
    """Library code logs (`logging.getLogger(__name__)`); only the command (mmrl/cli/) writes to the terminal itself,
    and it configures the handler that shows the library's messages (`mmrl.cli.configure_logging`)."""
    found = [f"{f.relative_to(ROOT)}:{line}" for name, f in modules().items() if name != "mmrl.cli" and not name.startswith("mmrl.cli.")
             for line in print_calls(f.read_text())]
    assert not found, found


def test_the_command_shows_library_messages_as_before(capsys, tmp_path):
    """Messages logged by library modules reach the command's stdout (info) and stderr (errors) as bare lines."""
    from mmrl.cli import main

    assert main(["pretrain-tiny", "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("sudoku4 ") for line in out), out  # the table logged by mmrl.tiny_world.pretrain_cli
    assert main(["pretrain-tiny", "no-such-model"]) == 2
    assert capsys.readouterr().err.startswith("mmrl pretrain-tiny: unknown model 'no-such-model'; valid: [")
    rows = tmp_path / "r.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"say {i}"}) + "\n" for i in range(10)))
    import logging

    from mmrl.data.tasks import load_task

    load_task("jsonl", str(rows), eval_split=3)  # in the process the command configured
    assert "task 'jsonl': holding out the last 3 of 10 rows" in capsys.readouterr().out
    assert len(logging.getLogger("mmrl").handlers) == 2  # added once, however often the command runs


def test_the_entry_points_load_on_first_use():
    code = ("import json, sys, mmrl; light = 'torch' not in sys.modules; from mmrl import Trainer, TrainConfig; "
            "import mmrl.training.trainer as t, mmrl.config.train_config as c; "
            "print(json.dumps([light, Trainer is t.Trainer, TrainConfig is c.TrainConfig, mmrl.load_config is c.load_config]))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True, cwd="/")
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [True, True, True, True]
    import mmrl

    try:
        mmrl.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("mmrl.no_such_name resolved")


def test_cited_path_pattern_reads_whole_path_components():
    assert CITED.findall("see results/protocol/sudoku-rewards/table.md and rewards/sudoku.py") == ["rewards/sudoku.py"]
    assert CITED.findall("(`docs/RESULTS.md`, mmrl/tiny_world/stats.py)") == ["docs/RESULTS.md", "mmrl/tiny_world/stats.py"]
