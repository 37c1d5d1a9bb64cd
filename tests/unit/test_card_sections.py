"""A card section a later stage replaces (``render.Section``, ``replace_section``): the publish gate's."""

from __future__ import annotations

from image_tfrecords.card.gate_verdict import SECTION, pending_blocks, verdict_blocks
from image_tfrecords.card.render import Heading, Para, render_html, render_md, replace_section

GATE = {"verdict": "approved", "approved_by": "<b>Ada</b>", "previous_version": "v1", "checks_run": 2,
        "tripped": ["class share: cats"],
        "checks": [{"check": "class_share", "of": "cats", "before": 0.5, "now": 0.2, "threshold": 0.1, "tripped": True},
                   {"check": "near_duplicates_across_labels", "before": 0, "now": 1, "threshold": 0,
                    "tripped": False}],
        "notes": ["quality flags: not compared"]}


def documents() -> tuple[str, str]:
    blocks = [Heading("Card", 1), Para("before"), *pending_blocks(), Para("after")]
    return render_md(blocks), render_html(blocks, "Card", {})


def test_the_verdict_replaces_the_pending_section_in_both_formats_and_again_gives_the_same() -> None:
    md, page = documents()
    assert "Not evaluated yet" in md and "Not evaluated yet" in page
    new_md = replace_section(md, SECTION, verdict_blocks(GATE), html_format=False)
    new_page = replace_section(page, SECTION, verdict_blocks(GATE), html_format=True)
    for text in (new_md, new_page):
        assert "Not evaluated yet" not in text
        assert text.count("section publish-gate -->") == 2  # one start, one end: nothing nested
        assert text.index("before") < text.index("Publish gate") < text.index("after")
    assert "published because \\<b\\>Ada\\</b\\> approved it in the Airflow UI" in new_md  # escaped, not markup
    assert "| class share | cats | 50.0% | 20.0% | ±10.0 points | TRIPPED |" in new_md
    assert "| near-duplicates across labels |  | 0 | 1 | +0 | ok |" in new_md
    assert "Note: quality flags: not compared" in new_md
    assert "&lt;b&gt;Ada&lt;/b&gt;" in new_page and "<b>Ada" not in new_page
    assert "<td>TRIPPED</td>" in new_page
    again = replace_section(new_md, SECTION, verdict_blocks(GATE), html_format=False)
    assert again == new_md
    assert replace_section(new_md, SECTION, verdict_blocks({"verdict": "off"}), html_format=False).count(
        "Off (the gate option)") == 1


def test_a_card_without_the_section_is_left_as_it_is() -> None:
    md = render_md([Heading("Card", 1), Para("no gate here")])
    assert replace_section(md, SECTION, verdict_blocks(GATE), html_format=False) == md


def test_checks_that_are_not_numbers_are_shown_as_they_are() -> None:
    """A manifest edited by hand (or from elsewhere) never stops the card: odd values are printed as given."""
    odd = {"verdict": "passed", "previous_version": "v1", "checks_run": 1,
           "checks": [{"check": "class_share", "of": "cats", "before": None, "now": "n/a", "threshold": [1]}]}
    md = replace_section(documents()[0], SECTION, verdict_blocks(odd), html_format=False)
    assert "| class share | cats | None | n/a | \\[1\\] | ok |" in md
