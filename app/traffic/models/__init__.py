"""Traffic's tables, by stage: raw rows as collected, the collectors' state, the diagnoses and
the sum tables. Imported from here: `from app.traffic.models import RequestRecord`."""

from app.traffic.models.collection import (
    CollectorProcess,
    KVGap,
    KVStream,
    RecordsReceived,
    RejectedInput,
    ResidentBlock,
    UndecodableSample,
)
from app.traffic.models.diagnosis import (
    FUNNEL_COLUMNS,
    LOST_COLUMNS,
    NEVER_REUSABLE,
    REUSABLE_LOST,
    REUSABLE_LOST_COLUMNS,
    RequestDiagnosis,
)
from app.traffic.models.loss_sums import (
    LossHour,
    LossMinute,
    LossTotals,
    ServerLossHour,
    ServerLossMinute,
    ServerLossQuarter,
    TemplateLossHour,
)
from app.traffic.models.prefix_sums import (
    TenantSalt,
    UnsaltedPrefixHour,
    UnsaltedPrefixMinute,
    UnsaltedPrefixTotals,
)
from app.traffic.models.raw import (
    EXPLORER_ROWS,
    KVEvent,
    MetricSeries,
    RequestRecord,
    Scrape,
    ScrapeSample,
    span_only_sql,
)
from app.traffic.models.request_sums import (
    HourRollup,
    MinuteRollup,
    RequestTotals,
    ServerRequestHour,
    ServerRequestMinute,
    TemplateRequestHour,
)
from app.traffic.models.server_sums import ServerHour, ServerMinute, ServerTotals

__all__ = [
    "EXPLORER_ROWS",
    "FUNNEL_COLUMNS",
    "LOST_COLUMNS",
    "NEVER_REUSABLE",
    "REUSABLE_LOST",
    "REUSABLE_LOST_COLUMNS",
    "CollectorProcess",
    "HourRollup",
    "KVEvent",
    "KVGap",
    "KVStream",
    "LossHour",
    "LossMinute",
    "LossTotals",
    "MetricSeries",
    "MinuteRollup",
    "RecordsReceived",
    "RejectedInput",
    "RequestDiagnosis",
    "RequestRecord",
    "RequestTotals",
    "ResidentBlock",
    "Scrape",
    "ScrapeSample",
    "ServerHour",
    "ServerLossHour",
    "ServerLossMinute",
    "ServerLossQuarter",
    "ServerMinute",
    "ServerRequestHour",
    "ServerRequestMinute",
    "ServerTotals",
    "TemplateLossHour",
    "TemplateRequestHour",
    "TenantSalt",
    "UndecodableSample",
    "UnsaltedPrefixHour",
    "UnsaltedPrefixMinute",
    "UnsaltedPrefixTotals",
    "span_only_sql",
]
