"""Helpers the benchmark scripts share: threads, timing with warm-up and repeats, summaries (median and spread),
paired ratios, peak memory in a fresh process, JSON output, a 32k-vocabulary offline tokenizer and a Qwen2-style
causal LM of a given size.

Conventions of every script in `benchmarks/`:
- `--smoke` runs in seconds (CI checks the JSON keys, never the timings); the default is the full size.
- the baseline is measured in the same process, on the same model and batch, interleaved round-robin with the
  candidates so that load from other processes hits all of them alike;
- each timing is summarised as median, quartiles, min, max and the list of values; ratios are ratios of medians,
  with the spread of the per-round (paired) ratios;
- peak memory is taken in a fresh process per variant: on CPU the kernel's high-water mark of the resident set
  (`VmHWM`, reset through `/proc/self/clear_refs` before the measured work) cross-checked by a thread polling
  `/proc/self/statm`; on CUDA `torch.cuda.max_memory_allocated`;
- `--out FILE` writes the JSON that `benchmarks/report.py` turns into the README's Performance section.
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------ environment
def set_threads(n: int, device: str = "cpu") -> None:
    """Intra-op threads: `n` on CPU (the project's machines have 2 cores shared by several jobs)."""
    import torch

    if device == "cpu":
        torch.set_num_threads(n)


def environment(device: str = "cpu", *, libraries: bool = True) -> dict[str, Any]:
    """What the numbers were measured on (`libraries=False`: without importing torch, for light parent processes)."""
    info: dict[str, Any] = {"python": platform.python_version(), "device": device, "cpu_count": os.cpu_count(),
                            "machine": platform.machine(), "load_average": os.getloadavg()}
    if libraries:
        import torch
        import transformers

        info.update(torch=torch.__version__, transformers=transformers.__version__, torch_threads=torch.get_num_threads())
        if device.startswith("cuda") and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    try:
        info["git_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                            timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):  # pragma: no cover
        info["git_commit"] = None
    return info


def sync(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------ timing
def summarize(values: Sequence[float]) -> dict[str, Any]:
    """Median, quartiles, min, max and the values themselves."""
    v = sorted(float(x) for x in values)
    if not v:
        return {"median": None, "p25": None, "p75": None, "min": None, "max": None, "n": 0, "values": []}
    q = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else [v[0], v[0], v[0]]
    return {"median": statistics.median(v), "p25": q[0], "p75": q[2], "min": v[0], "max": v[-1], "n": len(v),
            "values": [float(x) for x in values]}


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> dict[str, Any]:
    """median(num) / median(den), with the min / median / max of the per-round ratios num[i] / den[i]."""
    per_round = [a / b for a, b in zip(num, den) if b > 0]
    ratio = statistics.median(num) / statistics.median(den) if num and den and statistics.median(den) > 0 else None
    return {"ratio": ratio, "round_min": min(per_round, default=None), "round_median": statistics.median(per_round) if per_round else None,
            "round_max": max(per_round, default=None)}


def time_calls(fns: dict[str, Callable[[], Any]], *, repeats: int, warmup: int = 1, device: str = "cpu") -> dict[str, list[float]]:
    """Seconds of each call, `warmup` untimed rounds then `repeats` timed rounds, round-robin over `fns` (the order
    rotates every round so that no variant always runs first)."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            sync(device)
            t0 = time.perf_counter()
            fns[name]()
            sync(device)
            times[name].append(time.perf_counter() - t0)
    return times


def fmt_spread(s: dict[str, Any], unit: str = "s", scale: float = 1.0, digits: int = 2) -> str:
    """`median [min-max]` for a table cell."""
    if s.get("median") is None:
        return "-"
    return f"{s['median'] * scale:.{digits}f} [{s['min'] * scale:.{digits}f}-{s['max'] * scale:.{digits}f}]{unit}"


def print_table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> None:
    """A plain text table; `columns` = [(key, header)]."""
    cells = [[str(r.get(k, "")) for k, _ in columns] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, (_, h) in enumerate(columns)]
    print("  ".join(h.ljust(w) for (_, h), w in zip(columns, widths)))
    for c in cells:
        print("  ".join(x.ljust(w) for x, w in zip(c, widths)))


def write_json(path: str | os.PathLike | None, obj: dict[str, Any]) -> None:
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=_json_default) + "\n")
    os.replace(tmp, p)


def _json_default(x: Any) -> Any:
    if isinstance(x, (set, tuple)):
        return list(x)
    if isinstance(x, Path):
        return str(x)
    return repr(x)


# ------------------------------------------------------------------------------------------------ memory
def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _status_bytes(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        return None
    return None


class PeakMemory:
    """Peak memory of the work inside `with`: on CUDA `max_memory_allocated`, on CPU the resident-set high-water mark.

    On CPU the kernel's `VmHWM` is reset on entry (write 5 to `/proc/self/clear_refs`) and read on exit; a thread
    polling `/proc/self/statm` every 0.5 ms gives the same figure where the reset is not allowed. `base` is the
    memory in use on entry, `peak` the highest seen, `extra = peak - base`.
    """

    def __init__(self, device: str = "cpu"):
        self.device = str(device)
        self.base = self.peak = 0
        self.method = ""

    def __enter__(self) -> "PeakMemory":
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            self.method = "cuda max_memory_allocated"
            return self
        self.base = rss_bytes()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._hwm = True
        except OSError:
            self._hwm = False
        self._high = self.base
        self._done = threading.Event()

        def poll() -> None:
            while not self._done.is_set():
                self._high = max(self._high, rss_bytes())
                time.sleep(0.0005)

        self._thread = threading.Thread(target=poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
            return
        self._done.set()
        self._thread.join()
        hwm = _status_bytes("VmHWM") if self._hwm else None
        self.peak = max(self._high, hwm or 0)
        self.method = "VmHWM (reset by clear_refs) and RSS polling" if hwm else "RSS polling"

    @property
    def extra(self) -> int:
        return max(0, self.peak - self.base)

    def as_dict(self) -> dict[str, Any]:
        return {"base_bytes": self.base, "peak_bytes": self.peak, "extra_bytes": self.extra, "method": self.method}


def run_json_subprocess(argv: list[str], *, timeout: float | None = None, env: dict | None = None) -> dict[str, Any]:
    """Run `python argv...` in a fresh process and parse the JSON object on its last stdout line."""
    e = dict(os.environ, OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"), **(env or {}))
    out = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=e, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed with exit code {out.returncode}:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ models
def wide_tokenizer(vocab_size: int = 32000):
    """A character-level `PreTrainedTokenizerFast` (as `mmrl.models.tokenizers.char_tokenizer`: `<pad> <bos> <eos>
    <unk> <mask>` = 0-4, then printable ASCII) padded with filler tokens `<w5>`, `<w6>`, ... up to `vocab_size`
    entries, so a model with a realistic 32k vocabulary can decode everything it samples. Prompts still encode one
    token per character. Built offline."""
    import string

    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from mmrl.models.tokenizers import BASE_SPECIALS, CHAT_TEMPLATE

    chars = [c for c in string.printable if c not in "\x0b\x0c\r"]
    words = list(BASE_SPECIALS) + chars
    if vocab_size < len(words):
        raise ValueError(f"vocab_size must be >= {len(words)} (specials + printable characters), got {vocab_size}")
    words += [f"<w{i}>" for i in range(len(words), vocab_size)]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                  unk_token="<unk>", mask_token="<mask>")
    out.chat_template = CHAT_TEMPLATE
    return out


def qwen2_config(*, vocab_size: int, hidden: int, layers: int, intermediate: int | None = None, tokenizer=None, **extra):
    """A Qwen2 configuration (64-wide heads, half as many KV heads, tied embeddings as Qwen2.5-0.5B/1.5B)."""
    from transformers import Qwen2Config

    heads = max(1, hidden // 64)
    ids = {}
    if tokenizer is not None:
        ids = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate or (8 * hidden // 3 // 32) * 32,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                       max_position_embeddings=4096, tie_word_embeddings=True, **ids, **extra)


def build_qwen2(config, seed: int = 0):
    """A randomly initialised `Qwen2ForCausalLM`, seeded without touching the global RNG."""
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.eval()


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


BENCH_PROMPTS = [f"Question {i}: add {17 * i % 89} and {31 * i % 97}, then explain each step of the sum." for i in range(64)]
"""Prompt texts of the training benchmarks (about 60 characters = tokens each)."""


def char_sum_reward(prompts, completions, **kwargs) -> list[float]:
    """A cheap reward that varies across random completions: (sum of character codes mod 101) / 100."""
    return [(sum(map(ord, c)) % 101) / 100.0 for c in completions]
