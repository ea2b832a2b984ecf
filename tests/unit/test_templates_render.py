"""Template rendering without a database: strict variables, the sandbox, html escaping."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from postlane import InvalidMessage
from postlane.errors import TemplateError
from postlane.templates import TemplateVersion, check_name, compile_template


def version(subject: str = "Welcome, {{ name }}", text: str | None = "Hello {{ name }}",
            html: str | None = "<p>Hello {{ name }}</p>", *, name: str = "welcome",
            number: int = 1) -> TemplateVersion:
    return TemplateVersion(name, number, subject, text, html, datetime.now(UTC), number, False)


def test_renders_every_part_and_escapes_only_html() -> None:
    rendered = compile_template(version()).render({"name": "<Ada & Bob>"})
    assert rendered.subject == "Welcome, <Ada & Bob>"
    assert rendered.text == "Hello <Ada & Bob>"
    assert rendered.html == "<p>Hello &lt;Ada &amp; Bob&gt;</p>"


def test_a_missing_variable_is_an_error_naming_it() -> None:
    compiled = compile_template(version(text="Hi {{ name }}, code {{ code }}"))
    with pytest.raises(TemplateError, match="'code' is undefined") as caught:
        compiled.render({"name": "Ada"})
    assert isinstance(caught.value, InvalidMessage)
    assert "text" in str(caught.value) and "v1" in str(caught.value)


def test_the_sandbox_refuses_unsafe_attribute_access() -> None:
    compiled = compile_template(version(text="{{ name.__class__.__mro__ }}"))
    with pytest.raises(TemplateError, match="sandbox"):
        compiled.render({"name": "x"})


def test_a_syntax_error_is_reported_with_the_part() -> None:
    with pytest.raises(TemplateError, match="html: syntax error"):
        compile_template(version(html="<p>{% if %}</p>", number=99))


def test_variables_lists_what_the_template_uses() -> None:
    compiled = compile_template(version(
        subject="{{ a }}", text="{% for x in items %}{{ x }}{{ b }}{% endfor %}", html=None))
    assert compiled.variables == {"a", "b", "items"}


def test_message_carries_name_version_and_rendering() -> None:
    message = compile_template(version(number=3)).message(
        {"name": "Ada"}, key="welcome:1", to="ada@example.com", lane="bulk", import_id="i")
    assert (message.template_id, message.template_version) == ("welcome", 3)
    assert (message.subject, message.text, message.lane, message.import_id) == (
        "Welcome, Ada", "Hello Ada", "bulk", "i")


def test_same_name_and_version_with_other_text_is_not_served_from_the_cache() -> None:
    one = compile_template(version(text="one {{ name }}", name="cached"))
    two = compile_template(version(text="two {{ name }}", name="cached"))
    assert one.render({"name": "x"}).text == "one x"
    assert two.render({"name": "x"}).text == "two x"


@pytest.mark.parametrize("name", ["welcome", "reset.v2", "a-b_c", "X"])
def test_good_names(name: str) -> None:
    check_name(name)


@pytest.mark.parametrize("name", ["", "-x", "has space", "a:b", "x" * 101, "naïve"])
def test_bad_names(name: str) -> None:
    with pytest.raises(InvalidMessage):
        check_name(name)
