"""Where a chat request's parts start in its prompt, asked of the upstream server's /tokenize once the
answer has gone to the client (collectors/partstarts.py says which renderings, and why).

At most seven /tokenize calls a request, at once, each bounded by TIMEOUT_SECONDS. The whole
request's rendering must be the prompt the server answered for (its `prompt_token_ids`): a server
whose /tokenize renders otherwise (another template, a proxy in between) teaches no starts.
"""

import asyncio
from collections.abc import Sequence
from typing import Any

import aiohttp
import msgspec

from collectors.partstarts import FULL, part_starts, renderings
from collectors.tokenize.client import TokenizeFailed, tokens_from

TIMEOUT_SECONDS = 10.0


class StartsUnknown(Exception):
    """The starts could not be learned; the message says why (never prompt text or token ids)."""


async def learn_part_starts(
    session: aiohttp.ClientSession, upstream: str, body: bytes, prompt: Sequence[int]
) -> dict[str, int]:
    """Part (RequestPart's value) -> the token it starts at, for the chat-completions `body` whose
    prompt's token ids are `prompt`. Raises StartsUnknown."""
    payload = msgspec.json.decode(body)
    bodies = renderings(payload)
    found = await asyncio.gather(*(_tokenize(session, upstream, each) for each in bodies.values()))
    rendered = dict(zip(bodies, found, strict=True))
    if rendered[FULL] != list(prompt):
        raise StartsUnknown("/tokenize rendered another prompt than the one answered for")
    return part_starts(prompt, rendered)


async def _tokenize(session: aiohttp.ClientSession, upstream: str, body: dict[str, Any]) -> list[int]:
    try:
        async with session.post(
            upstream + "/tokenize",
            data=msgspec.json.encode(body),
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS),
        ) as response:
            if response.status != 200:
                raise StartsUnknown(f"/tokenize answered {response.status}")
            return tokens_from(msgspec.json.decode(await response.read()))[0]
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise StartsUnknown(f"/tokenize unreachable ({exc.__class__.__name__})") from None
    except (msgspec.DecodeError, TokenizeFailed):
        raise StartsUnknown("/tokenize gave no list of token ids") from None
