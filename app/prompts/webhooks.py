"""Push webhooks of GitHub and GitLab: what a delivery says, and whether its secret is the repository's.

GitHub signs the body with the shared secret (``X-Hub-Signature-256: sha256=<hex HMAC-SHA256>``);
GitLab sends the secret itself (``X-Gitlab-Token``). Both are compared in constant time. Pure: no
Django, no database.
"""

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

GITHUB_PUSH_EVENTS = ("push",)
GITLAB_PUSH_EVENTS = ("Push Hook", "Tag Push Hook")


class MalformedHook(ValueError):
    """The delivery is not a GitHub or GitLab webhook, or its body is not the JSON object they send."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One webhook delivery: who sent it, the event, the repository URLs it names, and its ref."""

    provider: str  # "github" or "gitlab"
    event: str
    urls: tuple[str, ...]
    ref: str

    @property
    def is_push(self) -> bool:
        events = GITHUB_PUSH_EVENTS if self.provider == "github" else GITLAB_PUSH_EVENTS
        return self.event in events


def parse_delivery(headers: Mapping[str, str], body: bytes) -> Delivery:
    """The delivery a request's headers (any case) and raw body make; MalformedHook otherwise.
    GitHub's form-encoded deliveries (``payload=<json>``) are read as well as JSON ones."""
    lower = {key.lower(): value for key, value in headers.items()}
    if "x-github-event" in lower:
        payload = _payload(body, form="application/x-www-form-urlencoded" in lower.get("content-type", ""))
        urls = _strings(payload.get("repository"), "clone_url", "html_url", "url")
        return Delivery("github", lower["x-github-event"].strip(), urls, _string(payload.get("ref")))
    if "x-gitlab-event" in lower:
        payload = _payload(body, form=False)
        urls = _strings(payload.get("project"), "git_http_url", "web_url", "http_url")
        urls += _strings(payload.get("repository"), "git_http_url", "homepage", "url")
        return Delivery("gitlab", lower["x-gitlab-event"].strip(), urls, _string(payload.get("ref")))
    raise MalformedHook("not a GitHub or GitLab webhook: no X-GitHub-Event or X-Gitlab-Event header")


def secret_problem(
    delivery: Delivery, headers: Mapping[str, str], body: bytes, secret: str
) -> tuple[int, str] | None:
    """None when the delivery carries the repository's secret; else (401, why) when it carries none,
    (403, why) when it carries another or the repository has no secret to check it with."""
    lower = {key.lower(): value for key, value in headers.items()}
    header = "x-hub-signature-256" if delivery.provider == "github" else "x-gitlab-token"
    sent = lower.get(header, "").strip()
    if not sent:
        return 401, f"no {header} header"
    if not secret:
        return 403, "the repository has no webhook secret; set one to accept its webhooks"
    if delivery.provider == "github":
        expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    else:
        expected = secret
    if not hmac.compare_digest(expected.encode(), sent.encode()):
        return 403, f"the {header} header does not match the repository's secret"
    return None


def _payload(body: bytes, *, form: bool) -> dict[str, Any]:
    try:
        text = parse_qs(body.decode(), strict_parsing=True)["payload"][0] if form else body.decode()
        payload = json.loads(text)
    except (UnicodeDecodeError, ValueError, KeyError) as exc:
        raise MalformedHook(f"the body is not a webhook's JSON: {exc.__class__.__name__}") from None
    if not isinstance(payload, dict):
        raise MalformedHook("the body is not a JSON object")
    return payload


def _strings(section: object, *keys: str) -> tuple[str, ...]:
    if not isinstance(section, dict):
        return ()
    return tuple(value for key in keys if isinstance(value := section.get(key), str) and value)


def _string(value: object) -> str:
    return value if isinstance(value, str) else ""
