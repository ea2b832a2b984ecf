"""``/docs`` serves Swagger UI from the package's own files: the page references no other
host, every asset it names is served, and the vendored files ship with their license."""

from __future__ import annotations

import re
from importlib import resources

import httpx

from postlane.api import create_app


async def test_the_interactive_docs_load_nothing_from_another_host() -> None:
    app = create_app("sqlite:///unused-docs.db", sample_interval_s=0, dashboard=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        page = await client.get("/docs")
        assert page.status_code == 200
        html = page.text
        urls = re.findall(r"""(?:src|href|url)\s*[=:]\s*['"]([^'"]+)['"]""", html)
        assert urls, html
        assert not [u for u in urls if "//" in u], f"another host in /docs: {urls}"
        assert "cdn" not in html.lower()
        assert "validatorUrl" in html and '"validatorUrl": null' in html
        for url in urls:
            asset = await client.get(url)
            assert asset.status_code == 200, url
        script = await client.get("/docs/assets/swagger-ui-bundle.js")
        assert "javascript" in script.headers["content-type"]
        assert "SwaggerUIBundle" in script.text
        assert (await client.get("/redoc")).status_code == 404  # it would load a CDN script


def test_the_vendored_files_ship_with_their_license() -> None:
    folder = resources.files("postlane.api").joinpath("static", "swagger-ui")
    names = {entry.name for entry in folder.iterdir()}
    assert {"swagger-ui-bundle.js", "swagger-ui.css", "LICENSE", "README.md"} <= names
    assert "Apache License" in folder.joinpath("LICENSE").read_text("utf-8")
