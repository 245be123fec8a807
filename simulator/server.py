"""One simulated vLLM server: the OpenAI-compatible HTTP API, /metrics, KV events and OTLP spans.

The prefix cache decides each request's cached tokens exactly as vLLM does (simulator/cache.py);
latency is modelled, not computed: TTFT = queue time + uncached tokens / prefill rate, so reuse
shows in TTFT as on a GPU. Requests are admitted one at a time (vLLM's scheduler order for a
sequential client), and with `sleep=False` answers come at once, for tests and benchmarks.
"""

import asyncio
import json
import logging
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import zmq.asyncio
from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import generate_latest

from app.domain import gpt2
from app.domain.blockhash import LoraKey
from app.domain.replay.pool import OutOfBlocks
from simulator import openai_requests
from simulator.block_metrics import BlockMetrics
from simulator.cache import PrefixCache
from simulator.kv_events import key_only_removed
from simulator.kv_publisher import KVPublisher
from simulator.metrics import CacheInfo, RequestTiming, ServerMetrics
from simulator.offload import MEDIUM_CPU, CpuTier
from simulator.openai_answers import ChatShape, CompletionShape
from simulator.openai_requests import Refused
from simulator.spans import SpanExporter

logger = logging.getLogger(__name__)

EOS_ID = 50256


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """How one simulated server looks from outside, and how fast it pretends to be."""

    name: str = "sim-0"
    host: str = "127.0.0.1"
    http_port: int = 8101
    kv_port: int = 5601
    replay_port: int = 5701
    model: str = "tiny"
    block_size: int = 32
    num_blocks: int = 48  # counts vLLM's null block, like --num-gpu-blocks-override
    cpu_blocks: int = 0  # a CPU offload tier of this many blocks behind the GPU's (0: none)
    cpu_reload: bool = True  # False: the tier's lookups fail, its blocks are recomputed (demoted)
    max_model_len: int = 512
    prefill_tokens_per_second: float = 8000.0
    decode_seconds_per_token: float = 0.004
    sleep: bool = True
    array_form_events: bool = False
    # The batches the replay endpoint still answers for, as vLLM's KVEventsConfig.buffer_steps.
    replay_buffer_steps: int = 10_000
    kv_cache_metrics: bool = True
    kv_cache_metrics_sample: float = 1.0  # the share of blocks observed; the captures' server ran with 1.0
    otlp_endpoint: str | None = None
    seed: int = 0
    # Served like vLLM's --lora-modules name=path: request one by its name as the `model`; vLLM
    # hashes the name and the path (verbatim) into its blocks and lists the path in /v1/models.
    lora_adapters: tuple[LoraKey, ...] = ()
    # Quirks of real engines (simulator/scenario.py `quirks`): a hybrid model whose hits align to a
    # Mamba group's block of `hybrid_block` tokens; speculative decoding by EAGLE (the last matched
    # block is dropped); a hit counter that is not wired (usage and counters say 0 cached tokens,
    # while TTFT still shows the reuse).
    hybrid_block: int | None = None
    speculative: bool = False
    hit_counter_wired: bool = True

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def topic(self) -> str:
        return f"kv@{self.host}:{self.http_port}@{self.model}"

    def adapter(self, model: str) -> LoraKey | None:
        """The LoRA adapter served under the model name ``model``; None for any other name."""
        return next((lora for lora in self.lora_adapters if lora.name == model), None)


@dataclass(frozen=True, slots=True)
class Completion:
    request_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    cached_tokens: int
    timing: RequestTiming
    sampling: Mapping[str, float | None] = field(default_factory=dict)  # top_p, temperature as asked
    created_cache_tokens: int = 0  # prompt tokens this request wrote to the cache (chat usage reports them)


def created_cache_tokens(prompt_tokens: int, cached_tokens: int, block_size: int) -> int:
    """vLLM's ``num_cache_creation_tokens``: the prompt tokens in the request's hashed (full) blocks
    at its first output, less those it found cached (``PrefillStats.finalize`` in vLLM 0.32)."""
    hashed = prompt_tokens // block_size * block_size
    return max(0, hashed - cached_tokens)


class BadRequest(Exception):
    """The request cannot be served; the message says which field is wrong."""


class Engine:
    """The prefix cache, metrics, events and spans of one server, fed one request at a time."""

    def __init__(self, config: ServerConfig, publisher: KVPublisher) -> None:
        self.config = config
        self.publisher = publisher
        self.spans = (
            SpanExporter(config.otlp_endpoint, server_name=config.name) if config.otlp_endpoint else None
        )
        self.lock = asyncio.Lock()
        self.restart(config)

    def restart(self, config: ServerConfig) -> None:
        """A fresh process: empty cache, counters at zero, event sequence from 0."""
        self.config = config
        info = CacheInfo(
            block_size=config.block_size, num_gpu_blocks=config.num_blocks,
            mamba_block_size=config.hybrid_block, speculative=config.speculative,
        )  # fmt: skip
        self.metrics = ServerMetrics(
            config.model, info, max_model_len=config.max_model_len, kv_cache_metrics=config.kv_cache_metrics
        )
        block_metrics = (
            BlockMetrics(self.metrics.observe_eviction, sample=config.kv_cache_metrics_sample,
                         clock=time.time, seed=config.seed)
            if config.kv_cache_metrics else None
        )  # fmt: skip
        lower = CpuTier(config.cpu_blocks, reload=config.cpu_reload) if config.cpu_blocks else None
        self.cache = PrefixCache(
            config.block_size, config.num_blocks, block_metrics=block_metrics,
            hit_block=config.hybrid_block, drops_last=config.speculative, lower=lower,
        )  # fmt: skip
        self.publisher.restart()
        self.busy_until = 0.0
        self.random = random.Random(config.seed)
        self.running: list[_Running] = []
        self.metrics.kv_cache_usage.labels(**self.metrics.labels).set_function(self.kv_usage)
        self.metrics.running.labels(**self.metrics.labels).set_function(lambda: len(self._runs_now()))

    def kv_usage(self) -> float:
        """``vllm:kv_cache_usage_perc`` when /metrics is read: the blocks held by the requests running
        then (their modelled prefill and decode), as a share of the usable blocks; cached blocks that no
        running request holds count as free, as in vLLM (so it reads 0 between requests, however full
        the prefix cache is). The cache runs each request at once: its blocks are released there, and
        only the gauge follows the modelled run."""
        held = frozenset().union(*(run.blocks for run in self._runs_now()))
        return max(len(held) / (self.cache.num_blocks - 1), self.cache.usage)

    def _runs_now(self) -> list["_Running"]:
        """The requests in their modelled prefill or decode now (``vllm:num_requests_running``)."""
        now = time.time()
        self.running = [run for run in self.running if run.end > now]
        return [run for run in self.running if run.start <= now]

    async def complete(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        salt: str | None,
        report_hits: bool,
        headers: Mapping[str, str],
        lora: LoraKey | None = None,
        sampling: Mapping[str, float | None] | None = None,
        chat: bool = False,
    ) -> Completion:
        """Run one request through the cache, publish its events, and wait out its modelled latency."""
        if len(prompt_ids) + max_tokens > self.config.max_model_len:
            raise BadRequest(f"prompt ({len(prompt_ids)} tokens) plus max_tokens exceeds max_model_len")
        arrival = time.time()
        async with self.lock:
            output, cached, held = self._run_through_cache(
                prompt_ids, max_tokens, salt=salt, report_hits=report_hits, lora=lora
            )
            await self.publish_events()
            timing = self._timing(arrival, len(prompt_ids), cached, len(output))
            if not self.config.hit_counter_wired:  # the reuse shows in TTFT only
                cached = 0
            self.metrics.observe_request(replace(timing, cached_tokens=cached))
            if self.config.sleep:  # answered at once, it has finished when the client hears of it
                start = arrival + timing.queue_seconds
                self.running.append(
                    _Running(start, start + timing.prefill_seconds + timing.decode_seconds, held)
                )
        if self.config.sleep:
            await asyncio.sleep(timing.e2e_seconds)
        request_id = headers.get("X-Request-Id") or uuid.uuid4().hex[:16]
        created = created_cache_tokens(len(prompt_ids), cached, self.config.block_size)
        done = Completion(request_id, prompt_ids, output, cached, timing, sampling or {}, created)
        if self.spans:
            self.spans.export(done, arrival=arrival, headers=headers, chat=chat)
        return done

    async def publish_events(self) -> None:
        """Send what the cache did since the last call."""
        await self.publisher.publish(self.cache.take_events())

    def _run_through_cache(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        *,
        salt: str | None,
        report_hits: bool,
        lora: LoraKey | None,
    ) -> tuple[list[int], int, frozenset[int]]:
        """Admit the request to the cache, add its output tokens and finish it: (output, cached tokens,
        the ids of the blocks it held).

        The cache's events are left for the caller to publish. Raises BadRequest when the request can
        never fit the KV cache.
        """
        engine_id = uuid.uuid4().hex
        output = [self.random.randrange(EOS_ID) for _ in range(max_tokens)]
        try:
            admission = self.cache.admit(
                engine_id, prompt_ids, cache_salt=salt, lora=lora, report_hits=report_hits
            )
            self.cache.append_output(engine_id, output)
        except (ValueError, OutOfBlocks) as exc:  # vLLM refuses what can never fit its KV cache
            self.cache.finish(engine_id)
            raise BadRequest(f"prompt plus max_tokens do not fit the KV cache: {exc}") from None
        held = self.cache.held_blocks(engine_id)
        self.cache.finish(engine_id)
        return output, admission.cached_tokens, held

    def _timing(self, arrival: float, prompt: int, cached: int, generated: int) -> RequestTiming:
        queue = max(0.0, self.busy_until - arrival)
        noise = self.random.uniform(0.95, 1.05)
        prefill = (prompt - cached) / self.config.prefill_tokens_per_second * noise + 0.002
        self.busy_until = arrival + queue + prefill
        decode = max(0, generated - 1) * self.config.decode_seconds_per_token
        return RequestTiming(prompt, cached, generated, queue, prefill, decode)


@dataclass(frozen=True, slots=True)
class _Running:
    """A request's modelled run (Unix seconds) and the KV blocks it holds meanwhile."""

    start: float
    end: float
    blocks: frozenset[int]


class SimulatedServer:
    """The aiohttp application and sockets of one server."""

    def __init__(self, config: ServerConfig, context: zmq.asyncio.Context) -> None:
        self.config = config
        self.context = context
        self.runner: web.AppRunner | None = None
        self.publisher: KVPublisher | None = None  # until start() has bound its sockets

    async def start(self) -> None:
        c = self.config
        self.publisher = KVPublisher(
            self.context,
            pub_endpoint=f"tcp://{c.host}:{c.kv_port}",
            replay_endpoint=f"tcp://{c.host}:{c.replay_port}",
            topic=c.topic,
            array_form=c.array_form_events,
            replay_capacity=c.replay_buffer_steps,
        )
        self.engine = Engine(c, self.publisher)
        self.runner = web.AppRunner(self.application(), access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, c.host, c.http_port).start()
        logger.info("simulated vLLM %s at %s", c.name, c.base_url)

    async def stop(self) -> None:
        if self.runner:
            await self.runner.cleanup()
        if self.publisher is None:  # start() failed binding the KV sockets (a port in use): nothing more
            return
        await self.publisher.close()
        if self.engine.spans:
            self.engine.spans.shutdown()

    def application(self) -> web.Application:
        app = web.Application(client_max_size=8 * 1024 * 1024, middlewares=[answer_refusals])
        app.add_routes(
            [
                web.post("/v1/completions", self.completions),
                web.post("/v1/chat/completions", self.chat_completions),
                web.post("/tokenize", self.tokenize),
                web.post("/detokenize", self.detokenize),
                web.get("/v1/models", self.models),
                web.get("/health", self.health),
                web.get("/version", self.version),
                web.get("/metrics", self.metrics),
                web.post("/reset_prefix_cache", self.reset_prefix_cache),
                web.post("/_simulator/restart", self.admin_restart),
                web.post("/_simulator/capacity", self.admin_capacity),
                web.post("/_simulator/undecodable_kv_events", self.admin_undecodable_events),
            ]
        )
        return app

    # --- OpenAI-compatible endpoints -------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request)
        model = self._served_model(body)
        return await self._answer(request, body, model, openai_requests.prompt_ids(body), chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request)
        model = self._served_model(body)
        return await self._answer(request, body, model, openai_requests.chat_prompt_ids(body), chat=True)

    def _served_model(self, body: dict[str, Any]) -> str:
        # vLLM validates the salt with the request body, then looks the model up, then renders the prompt.
        openai_requests.cache_salt(body)
        names = tuple(lora.name for lora in self.config.lora_adapters)
        return openai_requests.served_model(body, self.config.model, names)

    async def _answer(
        self, request: web.Request, body: dict[str, Any], model: str, prompt_ids: list[int], *, chat: bool
    ) -> web.StreamResponse:
        """Run the request through the engine; raises Refused for what vLLM would refuse."""
        max_tokens = openai_requests.output_budget(body, len(prompt_ids), self.config.max_model_len)
        xargs = body.get("vllm_xargs") or {}
        report_hits = isinstance(xargs, dict) and xargs.get("kv_cache_report_mode") == "full"
        try:
            done = await self.engine.complete(
                prompt_ids,
                max_tokens,
                salt=body.get("cache_salt"),
                report_hits=report_hits,
                headers=request.headers,
                lora=self.config.adapter(model),
                sampling={"top_p": body.get("top_p", 1.0), "temperature": body.get("temperature", 1.0)},
                chat=chat,
            )
        except BadRequest as exc:
            raise Refused(str(exc), param=None) from None
        shape = ChatShape() if chat else CompletionShape()
        if body.get("stream"):
            return await self._stream(request, body, done, shape)
        return web.Response(body=compact_json(shape.full(model, done, body)), content_type="application/json")

    async def _stream(
        self, request: web.Request, body: dict[str, Any], done: Completion, shape: CompletionShape
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        try:
            for chunk in shape.chunks(str(body.get("model") or self.config.model), done, body):
                await response.write(b"data: " + compact_json(chunk) + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionResetError:  # aiohttp's ClientConnectionResetError is one
            pass  # the client hung up mid-stream: vLLM aborts the request, and so the stream ends here
        return response

    async def tokenize(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        if isinstance(body.get("messages"), list):
            tokens = openai_requests.chat_prompt_ids(body, tokenize=True)  # as the chat completion renders
        elif isinstance(body.get("prompt"), str):
            tokens = gpt2.encode(body["prompt"])
        else:
            raise Refused("prompt: expected a string (or messages: a list)", param="prompt")
        strs = gpt2.token_strs(tokens) if body.get("return_token_strs") else None
        return web.json_response(
            {
                "count": len(tokens),
                "max_model_len": self.config.max_model_len,
                "tokens": tokens,
                "token_strs": strs,
            }
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        tokens = (await json_body(request)).get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise Refused("tokens: expected a list of token ids", param="tokens")
        return web.json_response({"prompt": gpt2.decode(tokens)})

    async def models(self, request: web.Request) -> web.Response:
        """vLLM's model list: the base model, then each adapter with its path as ``root``."""
        base = {"object": "model", "created": int(time.time()), "owned_by": "vllm"}
        models = [
            {**base, "id": self.config.model, "root": self.config.model, "parent": None,
             "max_model_len": self.config.max_model_len},
        ]  # fmt: skip
        models += [
            {**base, "id": lora.name, "root": lora.path, "parent": self.config.model, "max_model_len": None}
            for lora in self.config.lora_adapters
        ]
        return web.json_response({"object": "list", "data": models})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(self.engine.metrics.registry), content_type="text/plain", charset="utf-8"
        )

    # --- what operators (and the scenario's faults) do to a server ---------------------------

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        async with self.engine.lock:
            cleared = self.engine.cache.reset()
            await self.engine.publish_events()
        return web.Response(status=200 if cleared else 409)

    async def admin_restart(self, request: web.Request) -> web.Response:
        async with self.engine.lock:
            self.engine.restart(self.config)
        return web.json_response({"restarted": self.config.name})

    async def admin_capacity(self, request: web.Request) -> web.Response:
        blocks = (await json_body(request)).get("num_blocks")
        if not isinstance(blocks, int) or blocks < 2:
            raise Refused("num_blocks: expected an integer of at least 2", param="num_blocks")
        # vLLM sizes its cache at start-up: a capacity change is a restart with fewer blocks.
        self.config = replace(self.config, num_blocks=blocks)
        async with self.engine.lock:
            self.engine.restart(self.config)
        return web.json_response({"num_blocks": blocks})

    async def admin_undecodable_events(self, request: web.Request) -> web.Response:
        """Publish ``batches`` KV-event batches that a newer engine's shape makes undecodable, each
        numbered in the stream's sequence (no gap); the cache and its own events are untouched."""
        batches = (await json_body(request)).get("batches")
        if not isinstance(batches, int) or isinstance(batches, bool) or batches < 1:
            raise Refused("batches: expected an integer of at least 1", param="batches")
        async with self.engine.lock:
            for _ in range(batches):
                keys = [(self.engine.random.getrandbits(64), 0)]
                await self.engine.publisher.publish([key_only_removed(keys, medium=MEDIUM_CPU)])
        return web.json_response({"batches": batches})


def compact_json(payload: dict[str, Any]) -> bytes:
    """JSON as vLLM writes its answers: no spaces, text as UTF-8 (pydantic's model_dump_json for
    stream chunks, and Starlette's JSONResponse for whole answers, write the same bytes)."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; refused as FastAPI refuses a body that does not validate, otherwise."""
    try:
        body = await request.json()
    except json.JSONDecodeError:
        raise Refused("body: not JSON", param="body", kind="Bad Request") from None
    if not isinstance(body, dict):
        raise Refused("body: expected a JSON object", param="body", kind="Bad Request")
    return body


@web.middleware
async def answer_refusals(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A refused request gets vLLM's error answer."""
    try:
        return await handler(request)
    except Refused as refused:
        return error(refused)


def error(refused: Refused) -> web.Response:
    """vLLM's error answer."""
    return web.Response(
        body=compact_json(refused.answer()), status=refused.status, content_type="application/json"
    )
