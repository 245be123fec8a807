"""Record what Prometheus would scrape from a running Prefixscope and its vLLM servers, every 15 s.

    python deploy/prometheus/recordings/record.py --minutes 28 --out demo.jsonl.xz \
        --prefixscope http://127.0.0.1:8000 --vllm 127.0.0.1:8101 --vllm 127.0.0.1:8102 ...

One JSON line per scrape: the scrape's time (unix seconds, on a 15 s grid from the start), its job,
instance, whether it worked, and the exposition text as served. tests/support/recorded_scrapes.py turns a
recording into `promtool test rules` input series (job and instance labels as Prometheus would add
them, `up` per target). Started with the demo (`make run`), it records the demo scenario's faults at
their scenario times from the start (simulator/scenarios/demo.yaml).

Only the standard library and httpx (a project dependency): no Prefixscope import, so that it records
any deployment, e.g. with a bearer token for Prefixscope's /metrics (--token).
"""

import argparse
import json
import lzma
import signal
import sys
import threading
import time
from dataclasses import dataclass

import httpx

INTERVAL_SECONDS = 15


@dataclass(frozen=True)
class Target:
    job: str
    instance: str
    url: str


def targets(args: argparse.Namespace) -> list[Target]:
    found = [Target("prefixscope", args.prefixscope.split("://", 1)[-1], f"{args.prefixscope}/metrics")]
    found += [Target("vllm", instance, f"http://{instance}/metrics") for instance in args.vllm]
    return found


def scrape(client: httpx.Client, target: Target, at: float, token: str) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {token}"} if token and target.job == "prefixscope" else {}
    try:
        response = client.get(target.url, headers=headers, timeout=10)
        up = response.status_code == 200
        text = response.text if up else ""
    except httpx.HTTPError:
        up, text = False, ""
    return {"t": at, "job": target.job, "instance": target.instance, "up": up, "text": text}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--out", required=True, help="a .jsonl.xz file")
    parser.add_argument("--prefixscope", required=True, help="Prefixscope's web root, http://host:port")
    parser.add_argument("--vllm", action="append", default=[], help="host:port of a vLLM server")
    parser.add_argument("--token", default="", help="bearer token of Prefixscope's /metrics, if set")
    args = parser.parse_args()
    # Stopped early (SIGTERM, or Ctrl-C), it still closes the file: an unfinished xz stream is unreadable.
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    start = time.time()
    steps = int(args.minutes * 60 / INTERVAL_SECONDS) + 1
    with httpx.Client() as client, lzma.open(args.out, "wt") as out:
        for step in range(steps):
            at = start + step * INTERVAL_SECONDS
            if stop.wait(max(0.0, at - time.time())):
                break
            for target in targets(args):
                out.write(json.dumps(scrape(client, target, round(at, 3), args.token)) + "\n")
            out.flush()
            sys.stderr.write(f"step {step + 1}/{steps}\n")


if __name__ == "__main__":
    main()
