"""The HTTP reward client against real local servers on 127.0.0.1: the documented JSON protocol (text and PNG images),
bounded retries with backoff, timeouts, bad answers reported with the reward's name, never a silent 0; also reward
timeouts and retries of any reward through RewardSet, and a training step scored by a server named in the config."""
import base64
import io
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.config.train_config import load_config
from mmrl.models import adapter_class
from mmrl.rewards import RewardError, RewardSet, RewardTimeout
from mmrl.rewards.http import HttpReward, decode_image
from mmrl.training.trainer import Trainer, TrainingError
from tiny_world_fixtures import dataset_for


class Server:
    """A local reward server: `answer(payload, n)` gives (status, headers, body bytes) for the n-th request."""

    def __init__(self, answer):
        self.requests: list[dict] = []
        self.release = threading.Event()  # lets sleeping handlers finish at teardown
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                payload = json.loads(raw)
                server.requests.append({"path": self.path, "payload": payload, "content_type": self.headers["Content-Type"]})
                status, headers, body = answer(payload, len(server.requests))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/score"

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers = []

    def start(answer):
        servers.append(Server(answer))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def ok(values):
    return 200, {"Content-Type": "application/json"}, json.dumps({"rewards": values}).encode()


def length_answer(payload, n):
    return ok([float(len(c)) for c in payload["completions"]])


def test_text_protocol_through_the_registry(serve):
    srv = serve(length_answer)
    rs = RewardSet(["http"], http={"url": srv.url, "timeout": 5})
    out = rs(["p1", "p1", "p2"], ["a", "bb", "cccc"], answer=["1", "1", "2"], completion_ids=[[1], [2, 3], [4]])
    assert out.per_reward["http"].tolist() == [1.0, 2.0, 4.0] and out.valid.all()
    (req,) = srv.requests
    assert req["content_type"] == "application/json" and req["path"] == "/score"
    assert req["payload"] == {"prompts": ["p1", "p1", "p2"], "completions": ["a", "bb", "cccc"],
                              "columns": {"answer": ["1", "1", "2"], "completion_ids": [[1], [2, 3], [4]]}}
    assert out.metrics["rewards/http/attempts"] == 1.0


def test_images_are_sent_as_base64_png(serve):
    def brightness(payload, n):
        vals = []
        for c in payload["completions"]:
            assert c["type"] == "image" and c["format"] == "png"
            img = Image.open(io.BytesIO(base64.b64decode(c["data"])))
            assert img.format == "PNG"
            vals.append(float(np.asarray(img.convert("L"), dtype=np.float64).mean()))
        return ok(vals)

    srv = serve(brightness)
    images = [Image.new("RGB", (8, 6), (v, v, v)) for v in (0, 100, 255)]
    images[1].putpixel((0, 0), (7, 7, 7))
    out = RewardSet(["http"], http={"url": srv.url})(["a", "b", "c"], images)
    expect = [float(np.asarray(im.convert("L"), dtype=np.float64).mean()) for im in images]
    assert out.per_reward["http"].tolist() == pytest.approx(expect, abs=1e-4)
    sent = decode_image(srv.requests[0]["payload"]["completions"][1])
    assert np.array_equal(np.asarray(sent), np.asarray(images[1]))  # PNG is lossless


def test_retries_with_backoff_then_success(serve):
    def flaky(payload, n):
        if n <= 2:
            return 503, {"Retry-After": "0"}, b"busy"
        return length_answer(payload, n)

    srv = serve(flaky)
    rs = RewardSet(["http"], http={"url": srv.url, "retries": 2, "backoff": 0.01})
    out = rs(["p", "p"], ["x", "yy"])
    assert out.per_reward["http"].tolist() == [1.0, 2.0]
    assert len(srv.requests) == 3 and out.metrics["rewards/http/attempts"] == 3.0


@pytest.mark.parametrize("on_error", ["raise", "drop"])
def test_retries_exhausted_fail_the_whole_batch_never_zero(serve, on_error):
    srv = serve(lambda payload, n: (503, {}, b"down for maintenance"))
    rs = RewardSet(["http"], on_error=on_error, http={"url": srv.url, "retries": 2, "backoff": 0.0})
    if on_error == "raise":
        with pytest.raises(RewardError, match=r"reward 'http' could not score samples 0\.\.2: .*failed 3 time\(s\); last: .*HTTP 503.*down for maintenance"):
            rs(["p"] * 3, ["a", "b", "c"])
    else:
        out = rs(["p"] * 3, ["a", "b", "c"])
        assert out.valid.tolist() == [False] * 3 and torch.isnan(out.per_reward["http"]).all()
    assert len(srv.requests) == 3  # 1 + 2 retries, and no sample-by-sample re-run


def test_timeout_is_retried_then_reported(serve):
    def slow(payload, n):
        srv.release.wait(10)
        return length_answer(payload, n)

    srv = serve(slow)
    rs = RewardSet(["http"], http={"url": srv.url, "timeout": 0.2, "retries": 1, "backoff": 0.0})
    with pytest.raises(RewardError, match=r"reward 'http' could not score .*failed 2 time\(s\); last: timed out"):
        rs(["p", "p"], ["a", "b"])
    assert len(srv.requests) == 2


@pytest.mark.parametrize("body,needle", [
    (json.dumps({"rewards": [1.0, float("nan"), 0.5]}).encode(), r"reward 'http', sample 1: returned nan, which is not finite"),
    (json.dumps({"rewards": [1.0, 2.0]}).encode(), r"reward 'http' returned 2 values for 3 completions"),
    (json.dumps({"rewards": [1.0, "high", 0.5]}).encode(), r"reward 'http', sample 1: returned str 'high'"),
    (json.dumps({"scores": [1, 2, 3]}).encode(), r"needs a 'rewards' list, got keys \['scores'\]"),
    (b"<html>oops</html>", r"answer is not JSON"),
    (b"[" * 100000 + b"]" * 100000, r"answer is not JSON \(RecursionError"),
    (b'{"rewards": [1, 1e999, 1]}', r"reward 'http', sample 1: returned inf, which is not finite"),
    (json.dumps({"rewards": [10**400, 1, 1]}).encode(), r"reward 'http', sample 0: returned 1000.*\.\.\., too large for a float"),
])
def test_bad_answers_are_errors_naming_the_reward(serve, body, needle):
    srv = serve(lambda payload, n: (200, {}, body))
    with pytest.raises(RewardError, match=needle):
        RewardSet(["http"], http={"url": srv.url, "retries": 3, "backoff": 0.0})(["p"] * 3, ["a", "b", "c"])


def test_client_errors_and_redirects_are_not_retried_or_followed(serve):
    srv = serve(lambda payload, n: (400, {}, b"bad field 'completions'"))
    with pytest.raises(RewardError, match=r"HTTP 400 Bad Request: bad field 'completions'"):
        HttpReward(srv.url, retries=3, backoff=0.0)(["p"], ["a"])
    assert len(srv.requests) == 1
    moved = serve(lambda payload, n: (307, {"Location": srv.url}, b""))
    with pytest.raises(RewardError, match="redirects are not followed"):
        HttpReward(moved.url, retries=3, backoff=0.0)(["p"], ["a"])
    assert len(moved.requests) == 1 and len(srv.requests) == 1


def test_oversized_answer_is_refused(serve):
    srv = serve(lambda payload, n: ok([1.0] * 50000))
    with pytest.raises(RewardError, match="answered more than 1000 bytes"):
        HttpReward(srv.url, max_response_bytes=1000)(["p"], ["a"])


def test_unreachable_server_and_bad_configuration():
    with pytest.raises(RewardError, match=r"failed 2 time\(s\); last: connection failed"):
        RewardSet(["http"], http={"url": "http://127.0.0.1:9/score", "retries": 1, "backoff": 0.0})(["p"], ["a"])
    for url in ("file:///etc/passwd", "ftp://127.0.0.1/x", "127.0.0.1:8000", "http://"):
        with pytest.raises(ValueError, match="must be an http:// or https:// URL"):
            HttpReward(url)
    with pytest.raises(ValueError, match=r"timeout=0 must be a finite number of seconds \(> 0\)"):
        HttpReward("http://127.0.0.1:1/", timeout=0)
    with pytest.raises(ValueError, match="retries=-1 must be an integer >= 0"):
        HttpReward("http://127.0.0.1:1/", retries=-1)
    with pytest.raises(TypeError, match=r"cannot send column 'obj'.*columns=\[\.\.\.\]"):
        HttpReward("http://127.0.0.1:1/")(["p"], ["a"], obj=[object()])


# ------------------------------------------------------------------ timeouts and retries of any reward (RewardSet)

def test_any_reward_times_out_and_is_retried(tmp_path):
    calls = tmp_path / "calls"  # the reward runs in a worker process: it counts its calls in a file, not in memory

    def sometimes_hangs(prompts, completions, **kw):
        with open(calls, "a") as f:
            f.write("x")
        if calls.read_text() == "x":
            time.sleep(10)  # the first call hangs
        return [1.0] * len(completions)

    with pytest.warns(RuntimeWarning, match=r"reward 'sometimes_hangs' failed \(RewardTimeout.*retry 1 of 1"):
        out = RewardSet([sometimes_hangs], timeout=0.2, retries=1, retry_backoff=0.0)(["p"] * 2, ["a", "b"])
    assert out.per_reward["sometimes_hangs"].tolist() == [1.0, 1.0] and calls.read_text() == "xx"


def test_reward_timeout_without_retries_fails_the_batch():
    gate = threading.Event()

    def hangs(prompts, completions, **kw):
        gate.wait(10)
        return [1.0] * len(completions)

    try:
        with pytest.raises(RewardError, match=r"reward 'hangs' could not score samples 0\.\.1: .*did not return within 0\.1 s") as e:
            RewardSet([hangs], timeout=0.1)(["p"] * 2, ["a", "b"])
        assert isinstance(e.value.__cause__, RewardTimeout)
        out = RewardSet([hangs], timeout=0.1, on_error="drop")(["p"] * 2, ["a", "b"])
        assert out.valid.tolist() == [False, False] and math.isnan(out.per_reward["hangs"][0])
    finally:
        gate.set()


def test_retries_apply_backoff_doubling(monkeypatch):
    sleeps = []
    monkeypatch.setattr(time, "sleep", sleeps.append)
    calls = {"n": 0}

    def fails_thrice(prompts, completions, **kw):
        calls["n"] += 1
        if calls["n"] <= 3:
            raise ConnectionError("judge unreachable")
        return [0.5] * len(completions)

    with pytest.warns(RuntimeWarning):
        out = RewardSet([fails_thrice], retries=3, retry_backoff=0.5)(["p"], ["a"])
    assert out.total.tolist() == [0.5] and sleeps == [0.5, 1.0, 2.0]


# ------------------------------------------------------------------ the trainer, configured by name

def test_training_with_an_http_reward_from_the_config(serve, tmp_path):
    scored = []

    def vowels(payload, n):
        vals = [sum(ch in "aeiou" for ch in c) / (1 + len(c)) for c in payload["completions"]]
        scored.append(vals)
        return ok(vals)

    srv = serve(vowels)
    cfg = load_config(None, ["method=grpo", "family=causal_lm", "max_steps=1", "num_generations=4",
                             "per_device_train_batch_size=8", "max_completion_length=8", "learning_rate=1e-3",
                             f"output_dir={tmp_path}", "progress_bar=false", "report_to=[jsonl]", "reward_funcs=[http]",
                             f"reward_kwargs={{http: {{url: '{srv.url}', timeout: 5, retries: 1}}}}", "reward_retries=1"])
    assert cfg.reward_kwargs == {"http": {"url": srv.url, "timeout": 5, "retries": 1}}
    t = Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"))
    last = t.train()
    assert len(scored) == 1 and len(scored[0]) == 8
    assert last["rewards/http/mean"] == pytest.approx(sum(scored[0]) / 8)
    assert srv.requests[0]["payload"]["prompts"][:4] == [t.buffer.rollout.prompts[0]] * 4


def test_training_stops_when_the_reward_server_is_down(tmp_path):
    cfg = load_config(None, ["method=grpo", "family=causal_lm", "max_steps=2", "num_generations=4", "per_device_train_batch_size=8",
                             "max_completion_length=8", f"output_dir={tmp_path}", "progress_bar=false", "report_to=[jsonl]",
                             "reward_funcs=[http]", "reward_kwargs={http: {url: 'http://127.0.0.1:9/', retries: 0}}",
                             "on_reward_error=drop", "dynamic_sampling_max_tries=2"])
    t = Trainer(cfg, policy=adapter_class("causal_lm").tiny(seed=0), dataset=dataset_for("causal_lm"))
    with pytest.raises(TrainingError, match=r"could not fill a batch.*were dropped for failed rewards"):
        t.train()
