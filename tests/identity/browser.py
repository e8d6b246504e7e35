"""The user's side of a provider's login, as a browser does it: follow the provider's real
pages with httpx, fill the login form, approve (or deny) the device. No page is mocked.

A browser sends `Secure` cookies to a loopback address (a potentially trustworthy origin),
Python's cookie jar does not: cookies are kept here, by name, for the one provider.
"""

from __future__ import annotations

from html.parser import HTMLParser

import httpx


class _Forms(HTMLParser):
    """Each form of a page: its action and its named inputs (submit buttons apart)."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[tuple[str, dict[str, str], dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = {k: v or "" for k, v in attrs}
        if tag == "form":
            self.forms.append((attr.get("action", ""), {}, {}))
        elif tag in ("input", "button") and self.forms and attr.get("name"):
            _, fields, buttons = self.forms[-1]
            kind = attr.get("type", "submit" if tag == "button" else "text")
            (buttons if kind == "submit" else fields)[attr["name"]] = attr.get("value", "")


class Browser:
    def __init__(self) -> None:
        self.cookies: dict[str, str] = {}
        self.http = httpx.Client(timeout=30)

    def close(self) -> None:
        self.http.close()

    def go(
        self, method: str, url: str | httpx.URL, data: dict[str, str] | None = None
    ) -> httpx.Response:
        """The page at the end of the redirects, cookies kept on the way."""
        for _ in range(20):
            cookie = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
            response = self.http.request(method, url, data=data, headers={"Cookie": cookie})
            for header in response.headers.get_list("set-cookie"):
                pair, *attributes = header.split(";")
                name, _, value = pair.strip().partition("=")
                if value and "max-age=0" not in [a.strip().lower() for a in attributes]:
                    self.cookies[name] = value
                else:
                    self.cookies.pop(name, None)
            if not response.is_redirect:
                return response
            url, method, data = response.url.join(response.headers["location"]), "GET", None
        raise AssertionError(f"more than 20 redirects from {url}")

    def submit(
        self, page: httpx.Response, button: str | None = None, **values: str
    ) -> httpx.Response:
        """Post the page's form that has the fields of `values` (and `button`, if named)."""
        parser = _Forms()
        parser.feed(page.text)
        for action, fields, buttons in parser.forms:
            if set(values) <= set(fields) and (button is None or button in buttons):
                data = {**fields, **values}
                if button is not None:
                    data[button] = buttons[button]
                return self.go("POST", page.url.join(action), data)
        raise AssertionError(
            f"no form with {sorted(values)} {button or ''} on {page.url}:\n{page.text}"
        )
