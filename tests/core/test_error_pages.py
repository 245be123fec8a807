"""Without DEBUG (production, and `make run`), errors answer with plain pages in the site's style."""

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import include, path


def fails(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a bug")


urlpatterns = [path("fails/", fails), path("", include("app.urls"))]


@pytest.mark.urls("tests.core.test_error_pages")
def test_a_failing_view_answers_the_plain_500_page() -> None:
    response = Client(raise_request_exception=False).get("/fails/")
    html = response.content.decode()
    assert response.status_code == 500
    assert "Something went wrong" in html and 'href="/static/css/app.css"' in html
    assert "a bug" not in html and "Traceback" not in html


def test_a_missing_page_answers_the_plain_404_page(client: Client) -> None:
    response = client.get("/no-such-page/")
    html = response.content.decode()
    assert response.status_code == 404
    assert "Page not found" in html and "/no-such-page/" in html and "css/app.css" in html
    assert "URLconf" not in html


def test_the_favicon_is_the_sites_icon(client: Client) -> None:
    response = client.get("/favicon.ico")
    assert response.status_code == 302 and response["Location"] == "/static/favicon.svg"
    assert '<link rel="icon" href="/static/favicon.svg"' in client.get("/no-such-page/").content.decode()
