"""The demo's git host: register the load generator's template repository with Prefixscope, and send
the push webhook a git host sends whenever a commit lands in it.

    python -m app.demo_templates .data/demo-templates/<run> --web http://127.0.0.1:8000

The load generator makes one repository a round (`<folder>/round-K`) and pushes each of the
scenario's commits to it when the scenario reaches it (simulator/template_repo.py). The newest round
is registered as `demo-templates` (with the webhook secret in PREFIXSCOPE_DEMO_WEBHOOK_SECRET), and
each move of its branch is told to /api/v1/templates/hooks/git as GitHub tells it (a signed `push`),
so the worker imports it as it would a real deployment's repository. Imports no Django.
"""

import argparse
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

logger = logging.getLogger(__name__)

NAME = "demo-templates"
SECRET_ENV = "PREFIXSCOPE_DEMO_WEBHOOK_SECRET"
POLL_SECONDS = 1.0
REFUSED_WAIT_SECONDS = 60.0  # a refusal (wrong secret, say) will not change by itself: warn seldom
_ROUND = re.compile(r"round-(\d+)")
_REGISTERED_ID = re.compile(r"template repository \S+ \(id (\d+)\)")


def newest_round(folder: Path) -> tuple[Path, str] | None:
    """The newest round repository in `folder` and the commit its `main` is at; None before the first
    commit of the first round."""
    rounds = [path for path in folder.glob("round-*") if _ROUND.fullmatch(path.name)]
    for path in sorted(rounds, key=lambda p: int(p.name.removeprefix("round-")), reverse=True):
        ref = path / ".git" / "refs" / "heads" / "main"  # loose: fresh repositories, never packed
        with contextlib.suppress(OSError):
            return path, ref.read_text().strip()
    return None


def register(path: Path) -> int:
    """Register `path` as the demo's repository (the round before it is replaced); its id.
    Raises CalledProcessError when the command fails (it printed why)."""
    args = [
        str(path),
        f"--name={NAME}",
        "--glob=templates/*.j2",
        "--branch=main",
        f"--secret-env={SECRET_ENV}",
    ]
    done = subprocess.run(
        [sys.executable, "manage.py", "register_template_repository", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    found = _REGISTERED_ID.search(done.stdout)
    if found is None:
        raise subprocess.CalledProcessError(0, "register_template_repository", done.stdout, done.stderr)
    return int(found[1])


def send_push(web: str, repository: int, head: str, secret: str) -> str:
    """Send GitHub's push webhook for `head` of the repository: "queued" (202), "retry" when the web
    process is not up yet or the task queue is away, "refused" for another answer (a wrong secret,
    no such repository), logged as a warning."""
    body = json.dumps({"ref": "refs/heads/main", "after": head}).encode()
    signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "push", "X-Hub-Signature-256": signature}
    url = f"{web.rstrip('/')}/api/v1/templates/hooks/git?repository={repository}"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        if exc.code == 503:
            return "retry"
        status = exc.code
    except OSError:  # refused or timed out: the web process is starting
        return "retry"
    if status == 202:
        return "queued"
    logger.warning("the push webhook of %s was answered %s, not 202 (queued)", head[:12], status)
    return "refused"


def follow(folder: Path, web: str, secret: str) -> None:
    """Register each new round and send a push webhook for each move of its branch. Runs until stopped."""
    registered: tuple[Path, int] | None = None
    told: tuple[Path, str] | None = None
    while True:
        latest = newest_round(folder)
        if latest is not None and latest != told:
            if registered is None or registered[0] != latest[0]:
                try:
                    registered = (latest[0], register(latest[0]))
                except subprocess.CalledProcessError as exc:  # tried again at the next poll
                    logger.warning("registering %s failed: %s", latest[0], (exc.stderr or exc.stdout).strip())
                    time.sleep(POLL_SECONDS * 10)
                    continue
                logger.info("registered %s as %s (id %d)", latest[0], NAME, registered[1])
            sent = send_push(web, registered[1], latest[1], secret)
            if sent == "queued":
                logger.info("push webhook sent: %s at %s", latest[0].name, latest[1][:12])
                told = latest
            elif sent == "refused":
                time.sleep(REFUSED_WAIT_SECONDS)
        time.sleep(POLL_SECONDS)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m app.demo_templates", description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where the load generator makes its round repositories")
    parser.add_argument("--web", required=True, help="Prefixscope's base URL")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    secret = os.environ.get(SECRET_ENV, "")
    if not secret:
        sys.exit(f"{SECRET_ENV} is not set")
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C stops it quietly
        follow(args.folder, args.web, secret)


if __name__ == "__main__":
    main()
