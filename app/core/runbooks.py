"""The runbook of each alert in deploy/prometheus/rules, and who the alert pages.

Who: the `owner_kind` and `owner` labels deploy/alertmanager/alertmanager.yml routes on, and whether
its `severity` pages (critical, warning) or is a notice (info). tests/deploy/test_prometheus_rules.py
holds this list to the rules, so that a runbook cannot say one owner while the rule pages another.
"""

from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Owner:
    """An `owner_kind` and what its alerts' `owner` label holds."""

    kind: str
    owner: str


TEMPLATE_REPOSITORY = Owner("template", "the template's repository (unowned if none)")
# A regression's owner is its cause's: a prompt change's template, else the servers'.
REGRESSION_OWNER = Owner(
    "template",
    "the template's repository; the server's group (platform) for routing or a scope with no template",
)
SERVER_GROUP = Owner("platform", "the server's group (default platform)")
PLATFORM = Owner("platform", "platform")
PREFIXSCOPE = Owner("prefixscope", "prefixscope")
# The index's sections, in its order.
OWNER_KINDS = {
    "template": "Template owners: a prompt change",
    "platform": "Platform: the teams that run the servers",
    "prefixscope": "Prefixscope's operators: its own health",
}


@dataclass(frozen=True, slots=True)
class Runbook:
    alert: str
    severity: str  # critical | warning: a page; info: a notice, which never pages
    owner: Owner

    @property
    def pages(self) -> bool:
        return self.severity != "info"


RUNBOOKS = {
    "regression-open": Runbook("RegressionOpen", "warning", REGRESSION_OWNER),
    "template-hit-rate-dropped": Runbook("TemplateHitRateDropped", "warning", TEMPLATE_REPOSITORY),
    "new-cache-killer": Runbook("NewCacheKiller", "warning", TEMPLATE_REPOSITORY),
    "predicted-cache-break-live": Runbook("PredictedCacheBreakLive", "warning", TEMPLATE_REPOSITORY),
    "kv-capacity-short": Runbook("KVCapacityShort", "warning", SERVER_GROUP),
    "server-below-peers": Runbook("ServerBelowPeers", "warning", SERVER_GROUP),
    "kv-events-stalled": Runbook("KVEventsStalled", "warning", SERVER_GROUP),
    "server-scrapes-failing": Runbook("ServerScrapesFailing", "warning", SERVER_GROUP),
    "server-restarted": Runbook("ServerRestarted", "info", SERVER_GROUP),
    "hit-counter-not-wired": Runbook("HitCounterNotWired", "warning", SERVER_GROUP),
    "reuse-expected-none-delivered": Runbook("ReuseExpectedNoneDelivered", "critical", PLATFORM),
    "tenant-hit-rate-dropped": Runbook("TenantHitRateDropped", "warning", PLATFORM),
    "salt-rotated": Runbook("SaltRotated", "info", PLATFORM),
    "vllm-metrics-down": Runbook("VLLMMetricsDown", "critical", PLATFORM),
    "prefix-cache-hit-rate-dropped": Runbook("PrefixCacheHitRateDropped", "warning", PLATFORM),
    "prefix-cache-hit-rate-zero": Runbook("PrefixCacheHitRateZero", "warning", PLATFORM),
    "kv-cache-saturated": Runbook("KVCacheSaturated", "warning", PLATFORM),
    "vllm-kv-blocks-evicted-young": Runbook("VLLMKVBlocksEvictedYoung", "warning", PLATFORM),
    "vllm-kv-eviction-spike": Runbook("VLLMKVEvictionSpike", "warning", PLATFORM),
    "vllm-server-below-peers": Runbook("VLLMServerBelowPeers", "warning", PLATFORM),
    "vllm-server-restarted": Runbook("VLLMServerRestarted", "info", PLATFORM),
    "collector-silent": Runbook("CollectorSilent", "critical", PREFIXSCOPE),
    "kv-events-undecodable": Runbook("KVEventsUndecodable", "warning", PREFIXSCOPE),
    "kv-stream-unleased": Runbook("KVStreamUnleased", "critical", PREFIXSCOPE),
    "prefixscope-metrics-absent": Runbook("PrefixscopeMetricsAbsent", "critical", PREFIXSCOPE),
    "kv-event-batches-lost": Runbook("KVEventBatchesLost", "warning", PREFIXSCOPE),
    "kv-event-gaps-recurring": Runbook("KVEventGapsRecurring", "warning", PREFIXSCOPE),
    "server-scrapes-stale": Runbook("ServerScrapesStale", "warning", PREFIXSCOPE),
    "kv-leases-flapping": Runbook("KVLeasesFlapping", "warning", PREFIXSCOPE),
    "collector-backlog": Runbook("CollectorBacklog", "warning", PREFIXSCOPE),
    "gateway-spilled": Runbook("GatewaySpilled", "warning", PREFIXSCOPE),
    "analysis-lagging": Runbook("AnalysisLagging", "warning", PREFIXSCOPE),
    "input-rejected": Runbook("InputRejected", "warning", PREFIXSCOPE),
    "request-records-stopped": Runbook("RequestRecordsStopped", "warning", PREFIXSCOPE),
}


@dataclass(frozen=True, slots=True)
class RunbookGroup:
    kind: str
    heading: str
    pages: list[tuple[str, Runbook]]
    notices: list[tuple[str, Runbook]]


def runbooks_by_owner() -> Iterator[RunbookGroup]:
    """The runbooks by the owner_kind their alert is routed to, pages before notices."""
    for kind, heading in OWNER_KINDS.items():
        mine = [(slug, runbook) for slug, runbook in RUNBOOKS.items() if runbook.owner.kind == kind]
        yield RunbookGroup(
            kind=kind,
            heading=heading,
            pages=[(slug, runbook) for slug, runbook in mine if runbook.pages],
            notices=[(slug, runbook) for slug, runbook in mine if not runbook.pages],
        )
