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

Failures are bounded and never a silent 0: a refused connection, a timeout (`timeout` seconds for the whole request:
connect, headers and body, however slowly the server trickles them) or a 408/429/5xx status is retried up to `retries` times after
`backoff * 2**k` seconds (at most `max_backoff`, or the server's `Retry-After` if longer, up to `max_backoff`); then
the call raises `RewardUnavailable`, which `RewardSet` applies to every sample of the batch (stop, or drop under
`on_reward_error=drop`). Other statuses (4xx), redirects, an answer that is not JSON, has no `rewards` list or is
larger than `max_response_bytes` are errors at once (`RewardUnavailable`: the batch as a whole failed, it is not re-sent
one sample at a time). `RewardSet` then checks every value (NaN/inf, wrong length or
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
import threading
import time
import urllib.parse
from typing import Any, Mapping, Sequence

from mmrl.core.registry import REWARDS
from mmrl.rewards.combine import RewardError, RewardUnavailable

RETRY_STATUS = (408, 429, 500, 502, 503, 504)
"""HTTP statuses that mean "try again later"."""


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
        timeout: seconds for the whole request: connect, send, status, headers and body (> 0).
        retries: retries after a connection error, a timeout or a 408/429/5xx status (>= 0).
        backoff, max_backoff: seconds before retry k + 1 are min(backoff * 2**k, max_backoff).
        headers: extra request headers (e.g. an authorization token of your server).
        columns: names of the dataset columns to send (None: all).
        max_response_bytes: a longer answer is an error (a broken or hostile server cannot exhaust memory).
        proxy: an http(s) proxy URL; None connects directly (environment proxy variables are ignored).
    """

    in_process = True
    """Runs in the trainer's process under `reward_timeout` (`mmrl.rewards.isolation`): it holds a model or sockets."""

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
        self.proxy = proxy

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
                rewards = parse_rewards(answer)
            except _Retryable as e:
                last = e.cause
                if attempt < self.retries:
                    time.sleep(min(max(self.backoff * 2**attempt, e.retry_after), self.max_backoff))
                continue
            except RewardError as e:  # the server's answer as a whole is unusable: no sample to blame, no re-run per sample
                raise RewardUnavailable(str(e)) from None
            if log_metric is not None:
                log_metric("rewards/http/attempts", attempt + 1)
                log_metric("rewards/http/seconds", time.monotonic() - t0)
            return rewards
        raise RewardUnavailable(f"the reward server {self.url} failed {self.retries + 1} time(s); last: {last}")

    def _post(self, body: bytes) -> bytes:
        """The answer's body; `_Retryable` for failures worth another try, RewardError for the others.

        The whole exchange (connect, request, status line and headers, body) has `timeout` seconds: a watchdog shuts
        the socket down at the deadline, so a server that trickles its headers or body a byte at a time cannot hold
        the trainer (or a SIGTERM waiting for the step to end) longer than that."""
        conn, target = self._connection()
        expired = threading.Event()

        def abort():
            expired.set()
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked recv in the calling thread
                except OSError:
                    pass

        watchdog = threading.Timer(self.timeout, abort)
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.request("POST", target, body=body, headers={"Content-Type": "application/json", "Accept": "application/json",
                                                             **self.headers})
            resp = conn.getresponse()
            if 300 <= resp.status < 400:
                raise RewardError(f"the reward server {self.url} redirected ({resp.status}) to {resp.getheader('Location')!r}; "
                                  "redirects are not followed: configure the final URL")
            if resp.status >= 400:
                snippet = (resp.read(200).decode("utf-8", "replace").strip() or "(no body)") if not expired.is_set() else "(no body)"
                err = RewardError(f"the reward server {self.url} answered HTTP {resp.status} {resp.reason}: {snippet}")
                if resp.status in RETRY_STATUS:
                    raise _Retryable(err, _retry_after(resp.getheader("Retry-After")))
                raise err
            chunks, size = [], 0
            while chunk := resp.read1(1 << 16):
                size += len(chunk)
                if size > self.max_response_bytes:
                    raise RewardError(f"the reward server {self.url} answered more than {self.max_response_bytes} bytes")
                chunks.append(chunk)
            if expired.is_set():
                raise TimeoutError("deadline")
            return b"".join(chunks)
        except (http.client.HTTPException, OSError) as e:
            if expired.is_set() or isinstance(e, (socket.timeout, TimeoutError)):
                raise _Retryable(RewardUnavailable(f"timed out (no complete answer within {self.timeout:g} s)")) from None
            raise _Retryable(RewardUnavailable(f"connection failed ({type(e).__name__}: {e})")) from None
        finally:
            watchdog.cancel()
            conn.close()

    def _connection(self) -> tuple[http.client.HTTPConnection, str]:
        """A connection to the server (through `proxy` if set) and the request target to send."""
        parts = urllib.parse.urlsplit(self.url)
        target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        https = parts.scheme == "https"
        if self.proxy is None:
            cls = http.client.HTTPSConnection if https else http.client.HTTPConnection
            return cls(parts.hostname, parts.port, timeout=self.timeout), target
        proxy = urllib.parse.urlsplit(self.proxy)
        cls = http.client.HTTPSConnection if proxy.scheme == "https" else http.client.HTTPConnection
        if https:  # CONNECT tunnel through the proxy, TLS to the server
            conn = http.client.HTTPSConnection(proxy.hostname, proxy.port, timeout=self.timeout)
            conn.set_tunnel(parts.hostname, parts.port)
            return conn, target
        return cls(proxy.hostname, proxy.port, timeout=self.timeout), self.url


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


