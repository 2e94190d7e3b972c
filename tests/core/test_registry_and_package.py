"""Registries (docs/algorithms.md, "Registries"), the public import surface, and packaging."""
import pathlib
import subprocess
import sys
import tomllib

import pytest

import mmrl.algorithms as alg
from mmrl.algorithms import Registry, UnknownNameError

ROOT = pathlib.Path(__file__).resolve().parents[2]

CONTRACT = [
    "group_advantages", "policy_loss", "aggregate", "gcpo_token_weights", "gcpo_weights_from_scores",
    "hellinger_entropy", "dgpo_token_weights", "dmpo_weights", "dmpo_baseline", "wdce_loss", "wddo_loss",
    "copy_elbos", "dmpo_real_weights", "wddo_deltas", "soft_overlong_penalty", "accumulated_loss",
    "ADVANTAGES", "TOKEN_WEIGHTS", "AGGREGATIONS", "DMPO_BASELINES", "GCPO_DIVERGENCES",
]


def test_contract_names_importable():
    for name in CONTRACT:
        assert hasattr(alg, name), name


def test_contract_defaults():
    import inspect

    def defaults(fn):
        return {k: v.default for k, v in inspect.signature(fn).parameters.items() if v.default is not inspect.Parameter.empty}

    assert defaults(alg.group_advantages) == {"scale": "group", "eps": 1e-6, "scorable": None}
    d = defaults(alg.policy_loss)
    assert d == {"eps_low": 0.2, "eps_high": 0.2, "dual_clip": None, "ref_logp": None, "beta": 0.0, "kl_weights": None}
    assert defaults(alg.gcpo_token_weights) == {"divergence": "k3", "normalization": "rank_power", "top_fraction": 0.4, "target_mass": 0.8}
    assert defaults(alg.dgpo_token_weights) == {"tau": 0.5, "kappa": 1.0}
    assert defaults(alg.dmpo_weights) == {"alpha": 0.04, "coeff": 1.0}
    assert defaults(alg.dmpo_baseline) == {"alpha": 0.04, "coeff": 1.0, "log_theta_minus_v": None}


def test_registry_errors_list_valid_names():
    reg = Registry("thing")
    reg.register("b")(len)
    reg.register("a")(abs)
    with pytest.raises(UnknownNameError) as e:
        reg["c"]
    assert str(e.value) == "unknown thing 'c'; valid names: ['a', 'b']"
    assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(max)
    assert reg["a"] is abs and "c" not in reg and reg.get("c") is None  # plain dict semantics otherwise
    import mmrl.core.registry as engine

    for r in (alg.ADVANTAGES, alg.TOKEN_WEIGHTS, alg.AGGREGATIONS, alg.DMPO_BASELINES, engine.METHODS, engine.REWARDS,
              engine.TASKS, engine.MODEL_SOURCES):
        with pytest.raises(UnknownNameError, match="valid names"):
            r["no-such-name"]


def test_every_package_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    roots = {"mmrl": ROOT / "mmrl", "mmrl.models": ROOT / "models", "mmrl.rewards": ROOT / "rewards"}
    found = set()
    for name, path in roots.items():
        for init in path.rglob("__init__.py"):
            rel = init.parent.relative_to(path)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "mmrl.cli", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip().startswith("mmrl ")
