"""The committed settings page (docs/reference/settings.md) is the one the
code generates, as the AsyncAPI and OpenAPI documents are: a checkout has the
table without a docs build (issue 40), and it cannot go stale."""

from __future__ import annotations

import memq_refs


def test_the_committed_settings_page_is_current():
    page = memq_refs.SETTINGS_PAGE
    assert page.is_file(), f"no {page}: run `{memq_refs.SETTINGS_COMMAND}`"
    assert page.read_text() == memq_refs.settings_page(), f"{page} is stale: run `{memq_refs.SETTINGS_COMMAND}`"


def test_the_settings_page_lists_every_setting_and_shows_the_apps_shape():
    text = memq_refs.SETTINGS_PAGE.read_text()
    assert all(f"```{{envvar}} {s.env}\n" in text for s in memq_refs.settings())
    apps = text.split("```{envvar} MEMQ_HTTP__APPS\n", 1)[1].split("```{envvar}", 1)[0]
    assert """MEMQ_HTTP__APPS='{"my-app": {"api_key": """ in apps
