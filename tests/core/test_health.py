import pytest
from django.test import Client

from app.celery import celery_app
from tests.support.ports import unused_port


def closed_port() -> int:
    return unused_port()


def test_healthz_answers_without_touching_anything(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_is_ok_when_database_and_broker_answer(client: Client) -> None:
    response = client.get("/readyz")
    assert response.status_code == 200, response.content


@pytest.mark.django_db
def test_readyz_names_the_broker_when_it_is_unreachable(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(celery_app.conf, "broker_write_url", f"redis://127.0.0.1:{closed_port()}/0")
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["problems"] == ["broker: OperationalError"]
