"""A diagnosis has one typed shape from the domain to the page and the API: the model's choices are
the domain's causes, its stored losses read back as `Loss`, the request page and the API word them from
those, and the API's schema types them (`LossOut`, `Funnel` in FUNNEL_COLUMNS' order)."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from app.api.api import api
from app.api.diagnosis import Funnel
from app.diagnosis.run import diagnose_requests
from app.diagnosis.shown import Departure, ShownLoss, departure, shown_losses
from app.domain.misses import CAUSE_LABELS, UNKNOWN_LABELS, Cause, Loss
from app.traffic.models import FUNNEL_COLUMNS, RequestDiagnosis
from tests.domain.test_loss_json import STORED
from tests.support.factories import a_server, facts, ingested
from tests.support.users import fleet_viewer


def test_the_models_choices_are_the_domains_causes_with_their_labels() -> None:
    assert {c.value: c.label for c in RequestDiagnosis.Cause} == {
        c.value: label for c, label in CAUSE_LABELS.items()
    }
    unknown = {c.value: c.label for c in RequestDiagnosis.Unknown}
    assert unknown.pop("span_only")  # the store's own reason: a record no diagnosis reads
    assert unknown.pop("counter_not_wired")  # the store's too: its server's state, not the request's
    assert unknown.pop("gateway_cache")  # the store's too: answered before any model saw it
    assert unknown == {u.value: label for u, label in UNKNOWN_LABELS.items()}


def test_a_stored_diagnosis_reads_its_losses_typed_and_words_them() -> None:
    diagnosis = RequestDiagnosis(diverged_at=200, losses=STORED, cause="routed_elsewhere")
    assert diagnosis.loss_runs == tuple(Loss.from_json(stored) for stored in STORED)

    shown = shown_losses(diagnosis, names={7: "vllm-b"})  # server 3 is not one the viewer sees

    assert shown == [
        ShownLoss(0, 191, 192, "Routed elsewhere", "resident on vllm-b: its first 192 tokens"),
        ShownLoss(
            192,
            255,
            64,
            "Evicted",
            "on ?: stored 2026-03-01T10:00:00.123456+00:00, removed 2026-03-01T10:05:07+00:00",
        ),
        ShownLoss(256, 263, 8, "Shorter than one block", ""),
    ]
    assert departure(diagnosis, block_size=64) == Departure(at=200, changed_from=200, block=None, lost_to="")
    changed = [*STORED[:2], {"cause": Cause.PROMPT_CHANGED.value, "first_token": 256, "tokens": 8}]
    later = RequestDiagnosis(diverged_at=200, losses=changed, cause="prompt_changed")
    assert departure(later, block_size=64) == Departure(at=200, changed_from=256, block=3, lost_to="evicted")


def test_the_api_schema_types_a_diagnosis_losses_and_its_funnel() -> None:
    schemas = api.get_openapi_schema()["components"]["schemas"]
    losses = schemas["Diagnosed"]["properties"]["losses"]
    assert losses["items"] == {"$ref": "#/components/schemas/LossOut"}
    loss = schemas["LossOut"]
    assert set(loss["required"]) == {"cause", "first_token", "tokens"}
    assert set(loss["properties"]) == {
        *loss["required"],
        "server_id",
        "server_tokens",
        "stored_at",
        "removed_at",
    }
    assert schemas["LossGroup"]["properties"]["funnel"]["$ref"] == "#/components/schemas/Funnel"
    assert tuple(Funnel.model_fields) == FUNNEL_COLUMNS


@pytest.mark.django_db
def test_the_api_answers_stored_losses_as_they_were_stored_and_the_page_words_them(client: Client) -> None:
    server = a_server(name="vllm-a", block_size=16, model="m")
    now = timezone.now()
    sent = facts(
        server="vllm-a", model="m", prompt_tokens=40, cached_tokens=0, prompt_token_ids=list(range(1, 41))
    )
    (record,) = ingested(sent, source="gateway", now=now)
    diagnose_requests(now=now + timedelta(minutes=2))
    # A row as the diagnosis task wrote it before the losses had a type (STORED, servers renamed).
    stored = [{**STORED[1], "first_token": 0, "tokens": 32, "server_id": server.pk}, STORED[2]]
    RequestDiagnosis.objects.filter(request_id=record.request_id).update(cause="evicted", losses=stored)
    client.force_login(fleet_viewer("engineer"))

    answer = client.get(f"/api/v1/requests/vllm-a/{record.request_id}/diagnosis").json()
    detail = client.get(f"/api/v1/requests/vllm-a/{record.request_id}").json()
    page = client.get(f"/requests/vllm-a/{record.request_id}/").content.decode()

    assert answer["losses"] == detail["losses"] == stored
    assert list(answer["funnel"]) == list(FUNNEL_COLUMNS)
    assert "on vllm-a: stored 2026-03-01T10:00:00.123456+00:00, removed 2026-03-01T10:05:07+00:00" in page
    assert "removed from vllm-a at 10:05:07" in page  # the block chain's two full blocks
