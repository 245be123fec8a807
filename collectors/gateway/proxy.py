"""The gateway's HTTP side: an aiohttp reverse proxy that records the completions passing through it.

Every request goes to the upstream vLLM server and every answer back, status, headers and body
as they came (streams chunk by chunk), but for what `plan` adds and `answer` takes out again. A
successful `/v1/completions` or `/v1/chat/completions` answer becomes `RequestFacts` handed to the
recorder, which must return at once: recording never delays or fails the proxied request.

Headers an application may set (vLLM ignores them; they are forwarded unchanged):
- `X-Prefixscope-Tenant`: the tenant the request is for;
- `X-Prefixscope-Template`: the name of the prompt template the prompt was rendered from;
- `X-Prefixscope-Template-Version`: that template's version, the commit sha in its git repository.
`traceparent` (W3C) gives the trace id; the request id is the canonical one of the answer's `id`
(else the client's `X-Request-Id`), and the TTFT is the client's: until the first content reached it.

A chat request whose prompt token ids came back is recorded once its parts' starts are learned
(collectors/gateway/starts.py), after its answer went out; a failed look-up is counted
(`part_starts_unknown`) and the record kept without them. At most `starts_at_once` look-ups are
under way (the gateway command's PREFIXSCOPE_GATEWAY_PART_STARTS_AT_ONCE): past that, records go
without starts at once, counted so too; 0 asks for none.
"""

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Protocol

import aiohttp
import msgspec
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from collectors.errors import Rejection, RejectReason
from collectors.gateway.answer import AnswerFacts, StreamEditor, read_answer, strip_token_ids
from collectors.gateway.plan import RECORDED_PATHS, Plan, plan_request, trace_id_from
from collectors.gateway.starts import StartsUnknown, learn_part_starts
from collectors.records import RequestFacts, canonical_request_id
from collectors.usage.parse import Usage, UsageError, usage_from

logger = logging.getLogger(__name__)

TENANT_HEADER = "X-Prefixscope-Tenant"
TEMPLATE_HEADER = "X-Prefixscope-Template"
TEMPLATE_VERSION_HEADER = "X-Prefixscope-Template-Version"
MAX_BODY_BYTES = 64 * 1024 * 1024
# Meaningful for one connection only (RFC 9110, 7.6.1): never forwarded. Host is the upstream's.
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te",
     "trailer", "transfer-encoding", "upgrade"}
)  # fmt: skip
_NOT_ADDED = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")  # aiohttp's defaults
_WHOLE_BYTES = 1024 * 1024  # answers up to this size (with a Content-Length) are passed on in one write
# Below uvicorn's 5 s, so vLLM never closes a pooled connection just as the gateway reuses it.
_KEEPALIVE_SECONDS = 4.0
STARTS_AT_ONCE = 64  # part-start look-ups under way at once (each up to 7 /tokenize calls)


class Recorder(Protocol):
    """Where observations go; both calls must return at once and never raise."""

    def record(self, facts: RequestFacts) -> None: ...

    def reject(self, why: Rejection) -> None: ...


class Gateway:
    """Forwards to `upstream` (a base URL) over `session`, hands each completion to `recorder`;
    a chat request's parts are digested with `digest_key` (collectors/parts.py)."""

    def __init__(
        self,
        upstream: str,
        recorder: Recorder,
        session: aiohttp.ClientSession,
        *,
        digest_key: bytes = b"",
        starts_at_once: int = STARTS_AT_ONCE,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.recorder = recorder
        self.session = session
        self.digest_key = digest_key
        self.starts_at_once = starts_at_once
        self._learning: set[asyncio.Task[None]] = set()

    def application(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        arrived_at = datetime.now(UTC)
        plan: Plan | None = None
        data: bytes | aiohttp.StreamReader | None = request.content if request.body_exists else None
        if _recorded(request):
            data = await request.read()
            plan = plan_request(request.path, data, digest_key=self.digest_key)
            data = plan.body if plan else data
        try:
            upstream = await self.session.request(
                request.method,
                URL(self.upstream + request.raw_path, encoded=True),
                headers=_upstream_headers(request.headers, plan, body_read=isinstance(data, bytes)),
                data=data,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            logger.warning("upstream %s unreachable: %s", self.upstream, exc)
            return web.Response(status=502, text=f"gateway: upstream unreachable ({exc.__class__.__name__})")
        async with upstream:
            if plan is None or upstream.status != 200:
                return await _pass_through(request, upstream)
            if upstream.content_type == "text/event-stream":
                response, facts, ttft = await _stream(request, upstream, plan, started)
            else:
                response, facts, ttft = await _whole(request, upstream, plan, started)
        try:
            self._hand_over(request.headers, plan, facts, arrived_at=arrived_at, ttft=ttft)
        except Exception:  # the client has its answer; a recording bug must not turn it into an error
            logger.exception("recording a completion failed")
        return response

    async def drain(self) -> None:
        """Wait for the part-start look-ups under way, and so for their records."""
        await asyncio.gather(*self._learning)

    def _hand_over(
        self,
        headers: CIMultiDictProxy[str],
        plan: Plan,
        facts: AnswerFacts,
        *,
        arrived_at: datetime,
        ttft: float,
    ) -> None:
        """Record now, or once the parts' starts are learned (a chat request with its prompt's ids)."""
        if (
            plan.parts is None or facts.token_ids is None or facts.error or facts.malformed
            or not self.starts_at_once
        ):  # fmt: skip
            self._record(headers, plan, facts, arrived_at=arrived_at, ttft=ttft)
            return
        if len(self._learning) >= self.starts_at_once:
            self.recorder.reject(
                Rejection(RejectReason.PART_STARTS_UNKNOWN, "part starts: too many look-ups")
            )
            self._record(headers, plan, facts, arrived_at=arrived_at, ttft=ttft)
            return
        task = asyncio.get_running_loop().create_task(
            self._record_with_starts(headers, plan, facts, arrived_at=arrived_at, ttft=ttft)
        )
        self._learning.add(task)
        task.add_done_callback(self._learning.discard)

    async def _record_with_starts(
        self,
        headers: CIMultiDictProxy[str],
        plan: Plan,
        facts: AnswerFacts,
        *,
        arrived_at: datetime,
        ttft: float,
    ) -> None:
        assert plan.parts is not None and facts.token_ids is not None
        try:
            starts = await learn_part_starts(self.session, self.upstream, plan.body, facts.token_ids)
            plan = replace(plan, parts=msgspec.structs.replace(plan.parts, starts=starts))
        except StartsUnknown as exc:
            self.recorder.reject(Rejection(RejectReason.PART_STARTS_UNKNOWN, f"part starts: {exc}"))
        except Exception:  # a bug here must not lose the record
            logger.exception("learning the part starts failed")
            self.recorder.reject(Rejection(RejectReason.PART_STARTS_UNKNOWN, "part starts: gateway error"))
        try:
            self._record(headers, plan, facts, arrived_at=arrived_at, ttft=ttft)
        except Exception:
            logger.exception("recording a completion failed")

    def _record(
        self,
        headers: CIMultiDictProxy[str],
        plan: Plan,
        facts: AnswerFacts,
        *,
        arrived_at: datetime,
        ttft: float,
    ) -> None:
        if facts.malformed:
            self.recorder.reject(Rejection(RejectReason.BODY_INVALID, facts.malformed))
        if facts.error or facts.malformed:
            return
        try:
            usage = usage_from(facts.usage or {})
        except UsageError as exc:
            self.recorder.reject(Rejection(RejectReason.USAGE_INVALID, str(exc)))
            usage = Usage(None, None, None)
        call = RequestFacts(
            request_id=_request_id(facts, headers),
            arrived_at=arrived_at,
            client_ttft_seconds=ttft,
            trace_id=trace_id_from(headers.get("traceparent", "")),
            model=facts.model or plan.model,
            tenant=headers.get(TENANT_HEADER, ""),
            template=headers.get(TEMPLATE_HEADER, ""),
            template_version=headers.get(TEMPLATE_VERSION_HEADER, ""),
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
            cache_salt=plan.cache_salt,
            prompt_token_ids=facts.token_ids,
            parts=plan.parts,
        )
        if not facts.several_prompts:
            self.recorder.record(call)
            return
        # Several prompts in one call are as many requests to vLLM, each with its own span
        # (collectors/records.py names them); the answer's usage is their sum, so the cached tokens
        # of each are not known.
        for prompt, ids in sorted(facts.prompts.items()):
            self.recorder.record(
                msgspec.structs.replace(
                    call,
                    request_id=call.request_id if prompt == 0 else f"{call.request_id}#{prompt}",
                    prompt_tokens=len(ids),
                    cached_tokens=None,
                    completion_tokens=None,
                    prompt_token_ids=ids,
                )
            )


async def serve(
    host: str,
    port: int,
    upstream: str,
    recorder: Recorder,
    stop: asyncio.Event,
    *,
    digest_key: bytes = b"",
    starts_at_once: int = STARTS_AT_ONCE,
) -> None:
    """Proxy `host:port` to `upstream` until `stop` is set; requests in flight then get to finish."""
    async with upstream_session() as session:
        gateway = Gateway(upstream, recorder, session, digest_key=digest_key, starts_at_once=starts_at_once)
        runner = web.AppRunner(gateway.application(), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            logger.info("gateway on %s:%d in front of %s", host, port, upstream)
            await stop.wait()
        finally:
            await runner.cleanup()
            await gateway.drain()


def upstream_session() -> aiohttp.ClientSession:
    """Connections to vLLM: unlimited (streams are long), no total timeout (so are completions),
    answers left as sent (compressed or not), and no header the client did not send."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=_KEEPALIVE_SECONDS),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        auto_decompress=False,
        skip_auto_headers=_NOT_ADDED,
    )


def _request_id(facts: AnswerFacts, headers: CIMultiDictProxy[str]) -> str:
    """The canonical id: from vLLM's answer id (`cmpl-<id>`: the client's X-Request-Id, else vLLM's
    own), else the client's X-Request-Id as sent, else one made up (never empty)."""
    if facts.request_id:
        return canonical_request_id(facts.request_id)
    return headers.get("X-Request-Id") or f"gateway-{uuid.uuid4().hex}"


def _recorded(request: web.Request) -> bool:
    return (
        request.method == "POST"
        and request.path in RECORDED_PATHS
        and "Content-Encoding" not in request.headers  # a compressed body goes upstream untouched
    )


def _upstream_headers(
    headers: CIMultiDictProxy[str], plan: Plan | None, *, body_read: bool
) -> CIMultiDict[str]:
    forwarded = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in _HOP_BY_HOP)
    forwarded.popall("Host", None)
    if body_read:
        forwarded.popall("Content-Length", None)  # aiohttp sets it for the bytes that go
    if plan is not None and plan.edits_answer:
        forwarded["Accept-Encoding"] = "identity"  # answers must be readable to be edited
    return forwarded


def _answer_headers(upstream: aiohttp.ClientResponse, keep_length: bool) -> CIMultiDict[str]:
    dropped = _HOP_BY_HOP if keep_length else _HOP_BY_HOP | {"content-length"}
    return CIMultiDict((k, v) for k, v in upstream.headers.items() if k.lower() not in dropped)


async def _pass_through(request: web.Request, upstream: aiohttp.ClientResponse) -> web.StreamResponse:
    """The answer as it came: a small one whole, in one write; anything else streamed as it arrives."""
    length = upstream.content_length
    if length is not None and length <= _WHOLE_BYTES and request.method != "HEAD" and upstream.status >= 200:
        body = await upstream.read()
        whole = web.Response(
            body=body,
            status=upstream.status,
            reason=upstream.reason,
            headers=_answer_headers(upstream, False),
        )
        await _send(request, whole)
        return whole
    response = web.StreamResponse(
        status=upstream.status, reason=upstream.reason, headers=_answer_headers(upstream, True)
    )
    await response.prepare(request)
    try:
        async for chunk, last in _chunks(upstream):
            await (response.write_eof(chunk) if last else response.write(chunk))
        await response.write_eof()
    except ConnectionResetError:
        logger.debug("client went away before the end of the answer")
    return response


async def _whole(
    request: web.Request, upstream: aiohttp.ClientResponse, plan: Plan, started: float
) -> tuple[web.StreamResponse, AnswerFacts, float]:
    body = await upstream.read()
    sent = strip_token_ids(body) if plan.added_token_ids else body
    response = web.Response(
        body=sent, status=upstream.status, reason=upstream.reason, headers=_answer_headers(upstream, False)
    )
    await _send(request, response)
    return response, read_answer(body, samples=plan.samples), time.perf_counter() - started


async def _send(request: web.Request, response: web.Response) -> None:
    """Headers and body in one write (the handler returns the response already sent)."""
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionResetError:
        logger.debug("client went away before its answer")


async def _stream(
    request: web.Request, upstream: aiohttp.ClientResponse, plan: Plan, started: float
) -> tuple[web.StreamResponse, AnswerFacts, float]:
    """Forward the events as they come. TTFT: when the first chunk with content went to the client
    (the first chunk of any kind, for a stream without content)."""
    response = web.StreamResponse(
        status=upstream.status, reason=upstream.reason, headers=_answer_headers(upstream, False)
    )
    editor = StreamEditor(plan)
    first_sent: float | None = None
    ttft: float | None = None
    ended = False  # the upstream's whole answer read and passed on
    try:
        await response.prepare(request)  # a client gone already fails here (seen as make run stopped)
        async for chunk, last in _chunks(upstream):
            out = editor.feed(chunk) + (editor.close() if last else b"")
            ended = last
            await (response.write_eof(out) if last else response.write(out))
            if out:
                first_sent = first_sent or time.perf_counter()
                if ttft is None and editor.facts.content_seen:
                    ttft = time.perf_counter() - started
        ended = True
        await response.write_eof(editor.close())
    except ConnectionResetError:
        # A client that closes as soon as it has read `[DONE]` (many do) lost nothing: only one that
        # went away before the end makes the answer unseen, and its record unknown.
        logger.debug(
            "client went away %s", "after the end of a stream" if ended else "in the middle of a stream"
        )
        editor.facts.error = not ended
    if ttft is None:
        ttft = (first_sent or time.perf_counter()) - started
    return response, editor.facts, ttft


async def _chunks(upstream: aiohttp.ClientResponse) -> AsyncIterator[tuple[bytes, bool]]:
    """The body as it arrives, each piece with whether it ends the body: the last one then goes out
    with the end of the answer in one write (a chunked answer's terminator costs no extra packet)."""
    while chunk := await upstream.content.readany():
        yield chunk, upstream.content.at_eof()
