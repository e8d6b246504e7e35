"""GET /api/metrics/dashboard?job_id=: Kwollect's dashboard address redirects to Superset's
Job dashboard with its job filter set (tests/superset/ opens that address in a browser)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import httpx

PREFIX = "http://127.0.0.1:8088/superset/dashboard/jobscope-job/"


def redirect(api_url: str, **params: str) -> httpx.Response:
    response = httpx.get(f"{api_url}/api/metrics/dashboard", params=params, timeout=10)
    assert response.status_code == 307, response.text
    return response


def test_redirects_to_the_job_dashboard_filtered_on_the_job(api_url: str) -> None:
    location = redirect(api_url, job_id="4242").headers["location"]
    assert location.startswith(PREFIX + "?native_filters=")
    (state,) = parse_qs(urlsplit(location).query)["native_filters"]
    assert state == (
        "(NATIVE_FILTER-jobscope-job-id:(id:NATIVE_FILTER-jobscope-job-id,"
        "extraFormData:(filters:!((col:job_id,op:IN,val:!('4242')))),"
        "filterState:(label:'4242',value:!('4242')),ownState:()))"
    )


def test_job_ids_are_quoted_in_the_url_state(api_url: str) -> None:
    """Rison escapes ' and ! with !; nothing of the id can end the string early."""
    location = redirect(api_url, job_id="it's 1234_5!").headers["location"]
    (state,) = parse_qs(urlsplit(location).query)["native_filters"]
    assert "val:!('it!'s 1234_5!!')" in state


def test_without_a_job_the_dashboard_shows_the_newest(api_url: str) -> None:
    assert redirect(api_url).headers["location"] == PREFIX
