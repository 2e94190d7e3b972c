"""`http`: a reward computed by a server elsewhere, e.g. a reward model too large, or too old, to share the trainer's
environment (flow_grpo serves several of its reward models this way, README "Reward Preparation", after
ddpo-pytorch's LLaVA reward server).

Configure it by name: `reward_funcs=[http]`, `reward_kwargs={http: {url: "http://host:port/score", timeout: 60,
retries: 2}}`; or in Python `RewardSet(["http"], http={"url": ...})` / `HttpReward(url=...)`.

Protocol (JSON both ways; ddpo-pytorch exchanges pickles, and unpickling a server's answer would let the server run
code in the trainer):

    POST <url>  Content-Type: application/json
    {"prompts": [...], "completions": [...], "columns": {"<column>": [...], ...}}
    -> 200  {"rewards": [r_0, ..., r_{N-1}]}

- `prompts`: one per completion (repeated for the G responses of a prompt): strings, or chat messages as given.
- `completions`: strings for text models; an image (PIL) is `{"type": "image", "format": "png", "data": <base64>}`.
- `columns`: the dataset's other columns, one value per completion, encoded the same way (e.g. `answer`, `metadata`,
  `completion_ids`); `columns=[...]` in the configuration sends only those.
- `trainer_state` (in training): `{"global_step", "max_steps", "epoch"}` of TRL's `trainer_state` argument.
- `rewards`: a number, null ("does not apply") or a dict with a "score" key per completion, as any mmrl reward.

Failures are bounded and never a silent 0: a refused connection, a timeout (`timeout` seconds to connect and for each
read, the whole answer within about twice that) or a 408/429/5xx status is retried up to `retries` times after
`backoff * 2**k` seconds (at most `max_backoff`, or the server's `Retry-After` if longer, up to `max_backoff`); then
the call raises `RewardUnavailable`, which `RewardSet` applies to every sample of the batch (stop, or drop under
`on_reward_error=drop`). Other statuses (4xx), redirects, an answer that is not JSON, has no `rewards` list or is
larger than `max_response_bytes` are errors at once. `RewardSet` then checks every value (NaN/inf, wrong length or
type are errors naming the reward and the sample). Only http and https URLs are accepted; environment proxies are
not used unless `proxy` names one.
"""
from __future__ import annotations

import base64
import http.client
import io
import json
import math
import numbers
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping, Sequence

from mmrl.algorithms.registry import REWARDS
from mmrl.rewards.combine import RewardError, RewardUnavailable

RETRY_STATUS = (408, 429, 500, 502, 503, 504)
"""HTTP statuses that mean "try again later"."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise RewardError(f"the reward server {req.full_url} redirected ({code}) to {newurl!r}; redirects are not "
                          "followed: configure the final URL")


def encode_value(x: Any, where: str = "value") -> Any:
    """A JSON-ready copy of `x`: PIL images as base64 PNG dicts, tensors and arrays as lists; anything else that
    JSON cannot hold raises TypeError naming `where`."""
    if x is None or isinstance(x, (str, bool, int, float)):
        return x
    if isinstance(x, Mapping):
        return {str(k): encode_value(v, f"{where}.{k}") for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [encode_value(v, f"{where}[{i}]") for i, v in enumerate(x)]
    from PIL import Image

    if isinstance(x, Image.Image):
        buf = io.BytesIO()
        x.save(buf, format="PNG")
        return {"type": "image", "format": "png", "data": base64.b64encode(buf.getvalue()).decode("ascii")}
    if hasattr(x, "tolist"):  # torch tensors, numpy arrays and scalars
        return encode_value(x.tolist(), where)
    if isinstance(x, numbers.Real):
        return float(x)
    raise TypeError(f"cannot send {where} ({type(x).__name__}) to the reward server as JSON; choose the columns to "
                    "send with columns=[...]")


def decode_image(value: Mapping[str, Any]):
    """The PIL image of an encoded image dict (for servers written in Python, and tests)."""
    from PIL import Image

    if not (isinstance(value, Mapping) and value.get("type") == "image" and value.get("format") == "png"):
        raise ValueError(f"not an encoded image: {str(value)[:80]}")
    return Image.open(io.BytesIO(base64.b64decode(value["data"], validate=True))).copy()


def parse_rewards(body: bytes) -> list:
    """The `rewards` list of a server's answer; RewardError if it is not JSON or has no such list."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise RewardError(f"the reward server's answer is not JSON ({type(e).__name__}: {str(e)[:120]}); starts with "
                          f"{body[:80]!r}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rewards"), list):
        what = f"keys {sorted(map(str, data))[:10]}" if isinstance(data, dict) else type(data).__name__
        raise RewardError(f"the reward server's answer needs a 'rewards' list, got {what}")
    return data["rewards"]


@REWARDS.register("http")
class HttpReward:
    """A reward served over HTTP (see the module docstring for the protocol and the failure rules).

    Args:
        url: the endpoint that scores a batch (http or https).
        timeout: seconds to connect and for each read of the answer (> 0).
        retries: retries after a connection error, a timeout or a 408/429/5xx status (>= 0).
        backoff, max_backoff: seconds before retry k + 1 are min(backoff * 2**k, max_backoff).
        headers: extra request headers (e.g. an authorization token of your server).
        columns: names of the dataset columns to send (None: all).
        max_response_bytes: a longer answer is an error (a broken or hostile server cannot exhaust memory).
        proxy: an http(s) proxy URL; None connects directly (environment proxy variables are ignored).
    """

    __name__ = "http"

    def __init__(self, url: str, *, timeout: float = 60.0, retries: int = 2, backoff: float = 0.5, max_backoff: float = 30.0,
                 headers: Mapping[str, str] | None = None, columns: Sequence[str] | None = None,
                 max_response_bytes: int = 64 * 2**20, proxy: str | None = None):
        parts = urllib.parse.urlsplit(str(url))
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"http reward: url={url!r} must be an http:// or https:// URL with a host")
        for name, value, ok in (("timeout", timeout, lambda v: v > 0), ("backoff", backoff, lambda v: v >= 0),
                                ("max_backoff", max_backoff, lambda v: v >= 0)):
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or not ok(value):
                raise ValueError(f"http reward: {name}={value!r} must be a finite number of seconds "
                                 f"({'> 0' if name == 'timeout' else '>= 0'})")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"http reward: retries={retries!r} must be an integer >= 0")
        if isinstance(max_response_bytes, bool) or not isinstance(max_response_bytes, int) or max_response_bytes < 1:
            raise ValueError(f"http reward: max_response_bytes={max_response_bytes!r} must be a positive integer")
        if proxy is not None and urllib.parse.urlsplit(proxy).scheme not in ("http", "https"):
            raise ValueError(f"http reward: proxy={proxy!r} must be an http:// or https:// URL")
        self.url, self.timeout, self.retries = str(url), float(timeout), retries
        self.backoff, self.max_backoff = float(backoff), float(max_backoff)
        self.headers = {str(k): str(v) for k, v in (headers or {}).items()}
        self.columns = None if columns is None else list(columns)
        self.max_response_bytes = max_response_bytes
        proxies = {} if proxy is None else {"http": proxy, "https": proxy}
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler(proxies), _NoRedirect())

    def __call__(self, prompts, completions, **kwargs) -> list:
        log_metric = kwargs.pop("log_metric", None)
        kwargs.pop("log_extra", None)
        state = kwargs.pop("trainer_state", None)
        columns = {k: v for k, v in kwargs.items() if (self.columns is None or k in self.columns) and not callable(v)}
        payload = {
            "prompts": encode_value(list(prompts), "prompts"),
            "completions": encode_value(list(completions), "completions"),
            "columns": {k: encode_value(v, f"column {k!r}") for k, v in columns.items()},
        }
        if state is not None:
            payload["trainer_state"] = {k: getattr(state, k, None) for k in ("global_step", "max_steps", "epoch")}
        body = json.dumps(payload).encode()
        t0 = time.monotonic()
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            try:
                answer = self._post(body)
            except _Retryable as e:
                last = e.cause
                if attempt < self.retries:
                    time.sleep(min(max(self.backoff * 2**attempt, e.retry_after), self.max_backoff))
                continue
            if log_metric is not None:
                log_metric("rewards/http/attempts", attempt + 1)
                log_metric("rewards/http/seconds", time.monotonic() - t0)
            return parse_rewards(answer)
        raise RewardUnavailable(f"the reward server {self.url} failed {self.retries + 1} time(s); last: {last}")

    def _post(self, body: bytes) -> bytes:
        """The answer's body; `_Retryable` for failures worth another try, RewardError for the others."""
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Accept": "application/json", **self.headers})
        deadline = time.monotonic() + 2 * self.timeout
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                chunks, size = [], 0
                while chunk := resp.read(1 << 16):
                    size += len(chunk)
                    if size > self.max_response_bytes:
                        raise RewardError(f"the reward server {self.url} answered more than {self.max_response_bytes} bytes")
                    if time.monotonic() > deadline:
                        raise _Retryable(TimeoutError(f"the answer took longer than {2 * self.timeout:g} s"))
                    chunks.append(chunk)
                return b"".join(chunks)
        except urllib.error.HTTPError as e:
            snippet = _snippet(e)
            err = RewardError(f"the reward server {self.url} answered HTTP {e.code} {e.reason}: {snippet}")
            if e.code in RETRY_STATUS:
                raise _Retryable(err, _retry_after(e.headers.get("Retry-After"))) from None
            raise err from None
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            kind = "timed out" if isinstance(reason, (socket.timeout, TimeoutError)) else "connection failed"
            raise _Retryable(RewardUnavailable(f"{kind} ({type(reason).__name__}: {reason})")) from None


class _Retryable(Exception):
    def __init__(self, cause: BaseException, retry_after: float = 0.0):
        super().__init__(str(cause))
        self.cause, self.retry_after = cause, retry_after


def _retry_after(value: str | None) -> float:
    try:
        seconds = float(value) if value is not None else 0.0
    except ValueError:  # an HTTP date: ignore it and use our own backoff
        return 0.0
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


def _snippet(e: urllib.error.HTTPError, limit: int = 200) -> str:
    try:
        text = e.read(limit).decode("utf-8", "replace")
    except Exception:  # the error body itself failed
        return "(no body)"
    return text.strip() or "(no body)"
