"""The strict editable install (`pip install -e . --config-settings editable_mode=strict`, docs/design.md "Import
path and disk path") lays out the installed package for static tools: a tree of links in which `mmrl/models/` and
`mmrl/rewards/` point into the repository's top-level `models/` and `rewards/` folders."""
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _newest_setuptools_dir() -> str | None:
    """The sys.path entry holding the newest setuptools that builds wheels by itself (>= 70.1, which ships
    bdist_wheel), for `--no-build-isolation` (no index is reachable here); None when there is none."""
    best = None
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        for dist in metadata.distributions(path=[entry]):
            if dist.metadata["Name"] == "setuptools":
                version = tuple(int(x) for x in dist.version.split(".")[:2] if x.isdigit())
                if version >= (70, 1) and (best is None or version > best[0]):
                    best = (version, entry)
    return best[1] if best else None


def test_strict_editable_install_links_the_top_level_folders(tmp_path):
    before = sorted(str(f) for f in (metadata.distribution("mmrl").files or []))
    src = tmp_path / "src"  # a copy: the install writes build/ next to pyproject.toml, never into the repository
    for name in ("mmrl", "models", "rewards"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    tools = _newest_setuptools_dir()
    assert tools is not None, "no setuptools >= 70.1 on sys.path (the project's build requirement is setuptools>=68)"
    env = {**os.environ, "PYTHONPATH": tools, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index", "--ignore-installed",
                           "--prefix", str(tmp_path / "prefix"), "-e", str(src), "--config-settings", "editable_mode=strict"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # --ignore-installed: the environment running the tests keeps its own install of mmrl
    assert sorted(str(f) for f in (metadata.distribution("mmrl").files or [])) == before
    pth = next((tmp_path / "prefix").rglob("__editable__.mmrl-*.pth"))
    tree = Path(pth.read_text().strip().splitlines()[0])
    assert tree.is_dir() and src in tree.parents
    for installed, on_disk in [("mmrl/models/base.py", "models/base.py"), ("mmrl/rewards/combine.py", "rewards/combine.py"),
                               ("mmrl/training/trainer.py", "mmrl/training/trainer.py"), ("mmrl/core/protocol.py", "mmrl/core/protocol.py")]:
        assert (tree / installed).resolve() == (src / on_disk).resolve(), installed
    assert not (tree / "models").exists() and not (tree / "rewards").exists()  # nothing called models at the top
    code = "import mmrl.models.base, mmrl.rewards.combine; print(mmrl.models.base.__file__)"
    out = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path[:0] = [{str(tree)!r}] + {sys.path[1:]!r}; {code}"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).resolve() == (src / "models" / "base.py").resolve()
