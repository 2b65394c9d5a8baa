"""A loopback OpenAI-compatible chat server that answers as one of three real servers does.

- `kind="vllm"` follows `vllm serve`: vllm/entrypoints/openai/serving_chat.py `create_chat_completion` and
  `chat_completion_full_generator`, with the request checks of vllm/entrypoints/openai/protocol.py
  `ChatCompletionRequest` and vllm/sampling_params.py: n choices, each with its `index`; stop strings end the
  text and are left out of it (finish_reason "stop"); `logprobs: true` gives each generated token's own
  log-probability and its `top_logprobs` alternatives; `top_logprobs` without `logprobs`, and greedy sampling
  (temperature 0) with n > 1, are HTTP 400.
- `kind="openai"` follows the hosted API (the openai package's ChatCompletion schema): as vLLM, except that
  greedy sampling with n > 1 is allowed.
- `kind="transformers"` follows `transformers serve`: transformers/cli/serving/chat_completion.py and
  utils.py `_validate_request`: `n`, `logprobs` and `top_logprobs` are in UNUSED_CHAT_COMPLETION_FIELDS,
  ignored with a warning (one choice, no log-probabilities); `stop` becomes generate's `stop_strings`, which end
  generation with the stop string still in the decoded text; fields outside the schema are HTTP 422.

GET /v1/models lists what the server serves, as vLLM's show_available_models
(vllm/entrypoints/openai/serving_models.py) does: one ModelCard per served name (`models`: {id: (root,
max_model_len)}), with its id, object "model", owned_by "vllm", root, parent null and max_model_len.

The model is scripted: a reply is `answer_with(request body)` (default: the last message and " STOP tail"), one
token per word; max_tokens cuts it (finish_reason "length"). Log-probabilities come from `logprobs_with(word,
body)`: the alternatives of that word's step as [(token, logprob)], most likely first; the generated word's own
log-probability is its entry there (the sampled token need not be the most likely one).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KINDS = ("vllm", "openai", "transformers")
# The request fields of the chat completions schema (openai's CompletionCreateParams) that these tests send or
# could; transformers serve answers 422 to any other.
SCHEMA_FIELDS = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop",
                 "seed", "logprobs", "top_logprobs", "stream", "frequency_penalty", "presence_penalty", "user"}
TRANSFORMERS_UNUSED = {"n", "logprobs", "top_logprobs", "presence_penalty", "user"}


class ChatServer:
    """A server of `kind` (see the module docstring) on a free loopback port; `requests` records each request's
    body and Authorization header. Faults: the first `failures` requests get HTTP `status`, and so does every
    request after the first `fail_after` (a server that breaks mid-run); `refuse_logprobs`
    answers a request for log-probabilities with HTTP 400 naming the field (hosted models that do not offer
    them); `raw_body(request body)` is sent as the reply's bytes instead (garbage, a huge reply; None: the normal
    reply); `trickle_s` (seconds, or a function of the request body) sends the reply 16 bytes at a time, one piece
    every trickle_s seconds; `hold` (an Event) keeps every reply until it is set or `hold_s` pass. `max_model_len`
with `count_tokens(messages)` (the prompt's tokens under the model's chat template): a prompt the length does not
hold is HTTP 400, as vllm/entrypoints/openai/serving_engine.py `_validate_input` refuses it."""

    def __init__(self, failures: int = 0, status: int = 503, answer_with: Callable[[dict], str] | None = None,
                 logprobs_with: Callable[[str, dict], list[tuple[str, float]]] | None = None,
                 refuse_logprobs: bool = False, raw_body: Callable[[dict], bytes | None] | None = None,
                 trickle_s: float | Callable[[dict], float] = 0.0, kind: str = "vllm",
                 hold: threading.Event | None = None, hold_s: float = 60.0, max_model_len: int | None = None,
                 count_tokens: Callable[[list[dict]], int] | None = None, fail_after: int | None = None,
                 models: dict[str, tuple[str, int]] | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r}: one of {KINDS}")
        self.kind, self.requests, self.warnings = kind, [], []
        self.max_model_len, self.count_tokens = max_model_len, count_tokens
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path != "/v1/models":
                    self.send_error(404)
                    return
                cards = [{"id": name, "object": "model", "created": 0, "owned_by": "vllm", "root": root,
                          "parent": None, "max_model_len": length, "permission": []}
                         for name, (root, length) in (models or {}).items()]
                data = json.dumps({"object": "list", "data": cards}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"body": body, "auth": self.headers.get("Authorization")})
                if hold is not None:
                    hold.wait(hold_s)
                if len(server.requests) <= failures or (fail_after is not None and len(server.requests) > fail_after):
                    code, reply = status, {"error": {"message": "try later"}}
                elif refuse_logprobs and body.get("logprobs"):
                    code, reply = 400, {"error": {"message": "logprobs is not supported by this model",
                                                 "param": "logprobs"}}
                else:
                    code, reply = server._answer(body, answer_with, logprobs_with)
                data = (raw_body(body) if raw_body else None) or json.dumps(reply).encode()
                pause = trickle_s(body) if callable(trickle_s) else trickle_s
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    if not pause:
                        self.wfile.write(data)
                    for start in range(0, len(data), 16) if pause else ():
                        self.wfile.write(data[start:start + 16])
                        self.wfile.flush()
                        time.sleep(pause)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up on the reply
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def _answer(self, body: dict, answer_with, logprobs_with) -> tuple[int, dict]:
        """(HTTP status, reply) as the server of self.kind answers `body`."""
        if self.kind == "transformers":
            unexpected = set(body) - SCHEMA_FIELDS
            if unexpected:
                return 422, {"detail": f"Unexpected fields in the request: {unexpected}"}
            if set(body) & TRANSFORMERS_UNUSED:
                self.warnings.append(f"Ignoring unsupported fields in the request: {set(body) & TRANSFORMERS_UNUSED}")
            n, logprobs = 1, False
        else:
            n, logprobs = body.get("n") or 1, bool(body.get("logprobs"))
            if body.get("top_logprobs") and not logprobs:
                return 400, {"error": {"message": "when using `top_logprobs`, `logprobs` must be set to true",
                                       "param": "top_logprobs"}}
            if self.kind == "vllm" and n > 1 and body.get("temperature", 1.0) < 1e-5:
                return 400, {"error": {"message": "n must be 1 when using greedy sampling", "param": "n"}}
        if self.max_model_len is not None and self.count_tokens is not None:
            tokens, wanted = self.count_tokens(body["messages"]), body.get("max_tokens")
            if tokens >= self.max_model_len:
                return 400, {"error": {"message": f"This model's maximum context length is {self.max_model_len} "
                                       f"tokens. However, your request has {tokens} input tokens. Please reduce the "
                                       "length of the input messages.", "param": "input_tokens"}}
            if wanted is not None and tokens + wanted > self.max_model_len:
                return 400, {"error": {"message": f"'max_tokens' or 'max_completion_tokens' is too large: {wanted}. "
                                       f"This model's maximum context length is {self.max_model_len} tokens and "
                                       f"your request has {tokens} input tokens.", "param": "max_tokens"}}
        words = (answer_with(body) if answer_with else body["messages"][-1]["content"] + " STOP tail").split()
        limit = body.get("max_tokens") or len(words)
        kept, finish = self._generate(words, limit, body.get("stop") or [])
        choices = [{"index": i, "finish_reason": finish, "message": {"role": "assistant", "content": " ".join(kept)},
                    "logprobs": self._logprobs(kept, body, logprobs_with) if logprobs else None} for i in range(n)]
        return 200, {"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": body["model"],
                     "choices": choices, "usage": {"prompt_tokens": 1, "completion_tokens": len(kept),
                                                   "total_tokens": 1 + len(kept)}}

    def _generate(self, words: list[str], limit: int, stop: list[str] | str) -> tuple[list[str], str]:
        """The words generated and the finish reason: a stop string ends generation (vLLM and OpenAI leave it out
        of the text, transformers serve keeps it), else max_tokens does."""
        stop = [stop] if isinstance(stop, str) else stop
        for count in range(1, min(limit, len(words)) + 1):
            text = " ".join(words[:count])
            hit = min((text.find(s) for s in stop if s in text), default=-1)
            if hit >= 0:
                if self.kind == "transformers":
                    return words[:count], "stop"
                return text[:hit].split(), "stop"
        return words[:limit], "length" if len(words) > limit else "stop"

    @staticmethod
    def _logprobs(words: list[str], body: dict, logprobs_with) -> dict:
        """`logprobs.content`: per token its text, its own log-probability and the top_logprobs alternatives."""
        content = []
        for word in words:
            alternatives = logprobs_with(word, body) if logprobs_with else [(word, -0.01)]
            own = dict(alternatives).get(word, alternatives[-1][1] - 1.0)
            content.append({"token": word, "logprob": own, "bytes": list(word.encode()),
                            "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())}
                                             for t, lp in alternatives[:body.get("top_logprobs") or 0]]})
        return {"content": content}

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
