"""The embedded OpenAI-compatible server: llama-cpp-python serving a small packaged GGUF model.

llama-cpp-python's server answers one request at a time, so a run starts `llm.local.servers` of
them (`LocalLLMServers`; default one per core, one thread each): one endpoint identity, one slot
per server, each request sent to the least busy one (pipeline.llm.slots.ServerPicker).

`LocalLLMServer(cfg)` starts llama-cpp-python's server on a free loopback port as a child process
in its own process group, waits until it answers, exposes `base_url`, and always stops it (on exit,
error, Ctrl-C and interpreter exit). The child is this module run as a script: it serves
`llama_cpp.server` unchanged except for three things:

- llama-cpp-python 0.3.36 rejects OpenAI's `response_format={"type": "json_schema", ...}` (its
  request model only knows "text" and "json_object"; it takes a schema as
  `{"type": "json_object", "schema": ...}`). A small ASGI shim rewrites the OpenAI shape into the
  llama.cpp one, so the single OpenAI client works unchanged against the embedded server.
- The child exits by itself when its parent process disappears (e.g. killed with SIGKILL), so a
  crashed run never leaves a server behind.
- Greedy requests with a JSON schema check the grammar on the picked token first, as llama.cpp's own
  server does (`pipeline.llm.llama_sampling`): the same answers, structured ones written about twice
  as fast.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, Awaitable, Callable

from pipeline.config import LLMConfig
from pipeline.errors import PipelineError

_PROJECT_ROOT = Path(__file__).resolve().parents[2]
_PARENT_ENV = "MEMPIPE_LOCAL_SERVER_PARENT"
_PORT_ATTEMPTS = 3


class LocalServerError(PipelineError):
    """The embedded server could not start; the message carries the end of its log."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(log is empty)"


class LocalLLMServer:
    """Context manager around the llama.cpp server child process.

    >>> with LocalLLMServer(cfg.llm) as server:
    ...     client = openai.OpenAI(base_url=server.base_url, api_key="local")

    The server answers to the model name `cfg.model` (its `--model_alias`) and ignores the API key.
    It listens on 127.0.0.1 only: Ray workers on the same node can reach it, other nodes cannot.
    """

    def __init__(self, cfg: LLMConfig, log_path: str | Path | None = None) -> None:
        self.cfg = cfg
        self.log_path = Path(log_path) if log_path is not None else None
        self.port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    # ------------------------------------------------------------------ public

    @property
    def base_url(self) -> str:
        if self.port is None or not self.running:
            raise LocalServerError("the local LLM server is not running")
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def model_path(self) -> Path:
        local = self.cfg.local
        if local.model_path:
            return Path(local.model_path).expanduser()
        from pipeline.models import reencoded_gguf, smollm2_gguf_path

        shipped = smollm2_gguf_path()
        return shipped if local.packaged_as == "shipped" else reencoded_gguf(shipped, local.packaged_as, local.cache_dir)

    def start(self) -> str:
        """Start the server and wait until it answers; returns `base_url`."""
        if self.running:
            return self.base_url
        try:
            import llama_cpp.server  # noqa: F401  (fail here, with advice, not in the child)
        except ImportError as e:
            raise LocalServerError(
                f"llm.provider=local needs llama-cpp-python with its server extra ({e}); install the "
                "'local' extra: pip install 'mempipe[local]' (see README for the build flags)"
            ) from None
        model = self.model_path()
        if not model.is_file():
            raise LocalServerError(f"llm.local.model_path: no such model file: {model}")
        try:
            for attempt in range(_PORT_ATTEMPTS):
                self._spawn(model)
                if self._wait_ready():
                    return self.base_url
                # Another process took the port between our probe and the server's bind: retry.
                if "address already in use" not in _log_tail(self._log_file()).lower():
                    break
            tail = _log_tail(self._log_file())
            code = self._proc.poll() if self._proc else None
            raise LocalServerError(
                f"the local LLM server (model {model}) exited with code {code} during startup; "
                f"log {self._log_file()}:\n{tail}"
            )
        except BaseException:
            # Timeout, startup failure or Ctrl-C while waiting: never leave the child behind.
            self.stop()
            raise

    def stop(self) -> None:
        """Terminate the server's process group (SIGTERM, then SIGKILL after 10 s). Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if proc is not None:
            try:
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        if self._log is not None:
            self._log.close()
            self._log = None
        atexit.unregister(self.stop)

    def __enter__(self) -> "LocalLLMServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- private

    def _log_file(self) -> Path:
        assert self.log_path is not None
        return self.log_path

    def _spawn(self, model: Path) -> None:
        if self._proc is not None:
            self.stop()
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="mempipe-llama-server-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        local = self.cfg.local
        threads = str(local.threads_per_server())
        cmd = [
            sys.executable, "-m", "pipeline.llm.local_server",
            "--model", str(model), "--host", "127.0.0.1", "--port", str(self.port),
            "--n_ctx", str(local.n_ctx), "--model_alias", self.cfg.model,
            # Both: llama-cpp-python reads the prompt on n_threads_batch (default: every core).
            "--n_threads", threads, "--n_threads_batch", threads,
            "--flash_attn", str(local.flash_attn).lower(),
        ]
        if local.prompt_cache_mb:
            cmd += ["--cache", "true", "--cache_type", "ram", "--cache_size", str(local.prompt_cache_mb << 20)]
        env = dict(os.environ)
        env[_PARENT_ENV] = str(os.getpid())
        # The child imports this package; make that work from a plain checkout too.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PROJECT_ROOT), env.get("PYTHONPATH")) if p)
        self._log = open(self.log_path, "wb")
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,  # own process group: Ctrl-C goes to us, we stop it ourselves
        )
        atexit.register(self.stop)

    def _wait_ready(self) -> bool:
        """True when GET /v1/models answers; False if the child died; raises on timeout."""
        assert self._proc is not None
        deadline = time.monotonic() + self.cfg.local.startup_timeout_s
        url = f"http://127.0.0.1:{self.port}/v1/models"
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.2)
        raise LocalServerError(
            f"the local LLM server did not answer within llm.local.startup_timeout_s="
            f"{self.cfg.local.startup_timeout_s}s; log {self._log_file()}:\n{_log_tail(self._log_file())}"
        )


class LocalLLMServers:
    """`llm.local.servers` embedded servers of one set-up, started at once and stopped together.

    >>> with LocalLLMServers(cfg.llm, log_path=logs / "llm-server.log") as urls:
    ...     run_cfg.set_local_url(cfg.llm, urls)

    Server i > 0 logs to `llm-server.<i>.log` beside the first's `log_path`.
    """

    def __init__(self, cfg: LLMConfig, log_path: str | Path | None = None) -> None:
        n = cfg.local.server_count()
        self.servers = [LocalLLMServer(cfg, log_path=_nth_log(log_path, i)) for i in range(n)]

    @property
    def urls(self) -> list[str]:
        return [s.base_url for s in self.servers]

    def start(self) -> list[str]:
        """Start every server (at once: each waits for its model to load); their `base_url`s.
        One that fails stops them all and raises its error."""
        try:
            with ThreadPoolExecutor(len(self.servers), thread_name_prefix="llama-start") as pool:
                return list(pool.map(LocalLLMServer.start, self.servers))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every server, each as `LocalLLMServer.stop` does. Idempotent."""
        for server in self.servers:
            server.stop()

    def __enter__(self) -> list[str]:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _nth_log(path: str | Path | None, i: int) -> Path | None:
    if path is None or i == 0:
        return Path(path) if path is not None else None
    path = Path(path)
    return path.with_name(f"{path.stem}.{i}{path.suffix}")


# --------------------------------------------------------------------------- child process side

def openai_response_format_to_llama(body: dict[str, Any]) -> dict[str, Any]:
    """Rewrite OpenAI's json_schema response_format into the shape llama-cpp-python accepts."""
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") == "json_schema":
        spec = rf.get("json_schema") or {}
        new_rf: dict[str, Any] = {"type": "json_object"}
        if isinstance(spec, dict) and isinstance(spec.get("schema"), dict):
            new_rf["schema"] = spec["schema"]
        body = {**body, "response_format": new_rf}
    return body


ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]],
                    Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]


class ResponseFormatShim:
    """ASGI middleware: applies `openai_response_format_to_llama` to chat completion requests."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not (scope.get("type") == "http" and scope.get("method") == "POST"
                and str(scope.get("path", "")).endswith("/chat/completions")):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # client went away
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            data = json.loads(body)
            if isinstance(data, dict):
                body = json.dumps(openai_response_format_to_llama(data)).encode()
        except ValueError:
            pass  # not JSON: let the server produce its own error
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls wait for the disconnect, as usual

        await self.app({**scope, "headers": headers}, replay, send)


def _exit_with_parent() -> None:
    """Exit when the process that started us is gone (we would be re-parented)."""
    parent = os.environ.get(_PARENT_ENV)
    if not parent:
        return

    def watch() -> None:
        while True:
            if os.getppid() != int(parent):
                os._exit(0)
            time.sleep(1.0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _serve() -> None:
    _exit_with_parent()
    import llama_cpp.server.__main__ as llama_main

    from pipeline.llm.llama_sampling import sample_grammar_last

    sample_grammar_last()

    original = llama_main.create_app
    llama_main.create_app = lambda *a, **kw: ResponseFormatShim(original(*a, **kw))
    llama_main.main()


if __name__ == "__main__":
    _serve()
