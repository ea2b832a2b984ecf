"""Template rendering without a database: strict variables, the sandbox, html escaping."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from types import MappingProxyType

import pytest
from markupsafe import Markup

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


# A template of text and ``{{ name }}`` only is rendered without Jinja's per-part context
# (``CompiledTemplate._substitute``); what it makes must be Jinja's rendering to the byte.
SUBSTITUTION_TEMPLATES = [
    ("Hi {{ a }}", "{{ a }} and {{ b }}\n", "<p>{{ a }}</p><i>{{ b }}</i>"),
    ("100% {{ a }} %(a)s %%", "%s {{b}} %d\n\n", "<b>%</b>{{ a }}%(b)s"),
    ("{{- a -}} x {{ a }}", "  {{- b }}  \n  {{ a -}}  ", None),
    ("{% raw %}{{ a }}{% endraw %} {{ a }}", "static only\n", "<p>static &amp; only</p>"),
    ("{{ a }}{{ a }}{{ b }}", None, "{{ b }}{{ a }}{{ b }}"),
    ("{# note #}{{ a }}", "{{ a }}{# {{ b }} #}", "{{ a }}"),
]
SUBSTITUTION_VALUES = [
    {"a": "Ada", "b": "Bob"},
    {"a": "<Ada & \"Bob\" 'O'>", "b": "%s %(a)s %% {{ a }}"},
    {"a": "", "b": "naïve 漢字 \U0001f600 \u2028"},
    {"a": "x", "b": "y", "extra": "ignored"},
]


@pytest.mark.parametrize("parts", SUBSTITUTION_TEMPLATES)
@pytest.mark.parametrize("values", SUBSTITUTION_VALUES)
def test_a_substitution_template_renders_as_jinja_does(
        parts: tuple[str, str | None, str | None], values: dict[str, str]) -> None:
    from postlane.templates import _COMPILER

    subject, text, html = parts
    compiled = compile_template(version(subject, text, html, name="substitution"))
    assert compiled._substitutions is not None
    got = compiled.render(values)
    assert got.subject == _COMPILER.plain.from_string(subject).render(values)
    assert got.text == (None if text is None
                        else _COMPILER.plain.from_string(text).render(values))
    assert got.html == (None if html is None
                        else _COMPILER.html.from_string(html).render(values))


@pytest.mark.parametrize("values", [{"name": 7}, {"name": Markup("<b>x</b>")},
                                   {"name": None}])
def test_a_value_that_is_not_a_str_is_rendered_by_jinja(values: dict[str, object]) -> None:
    from postlane.templates import _COMPILER

    rendered = compile_template(version(name="substitution")).render(values)
    assert rendered.html == _COMPILER.html.from_string("<p>Hello {{ name }}</p>").render(values)
    assert rendered.text == "Hello " + str(values["name"])


@pytest.mark.parametrize("text", ["{{ name|title }}", "{% if name %}{{ name }}{% endif %}",
                                  "{{ name.upper() }}", "{{ self }}", "{{ 'x' }}{{ name }}",
                                  "{% set x = name %}{{ x }}"])
def test_anything_but_names_and_text_is_left_to_jinja(text: str) -> None:
    compiled = compile_template(version(text=text, html=None, name="not-substitution"))
    assert compiled._substitutions is None
    assert compiled.render({"name": "ada"}).text


def test_a_missing_variable_in_a_substitution_template_is_reported_by_jinja() -> None:
    compiled = compile_template(version(text="Hi {{ name }}, code {{ code }}", html=None,
                                        name="substitution-missing"))
    assert compiled._substitutions is not None
    with pytest.raises(TemplateError, match="'code' is undefined"):
        compiled.render({"name": "Ada"})


def test_variables_other_than_a_dict_are_rendered_by_jinja() -> None:
    """A defaultdict would give the substitution a default where Jinja, which copies the
    variables, finds the name missing."""
    compiled = compile_template(version(text="Hi {{ name }} {{ code }}", html=None,
                                        name="substitution-defaultdict"))
    variables: defaultdict[str, str] = defaultdict(str, name="Ada")
    with pytest.raises(TemplateError, match="'code' is undefined"):
        compiled.render(variables)
    assert "code" not in variables
    assert compiled.render(MappingProxyType({"name": "Ada", "code": "7"})).text == "Hi Ada 7"
