import pytest

from seedfast.rollout.actions import parse_action


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>go east first</think><action>go east</action>", "go east"),
        ("<action> take   red\tkey </action>", "take red key"),
        ("<action>go north</action> then <action>go south</action>", "go south"),  # last tag wins
        ("<ACTION>open door</Action>", "open door"),
        ("<think>x</think><action>take coin", "take coin"),  # cut off before the closing tag
        ("<action>go west</action><action>", "go west"),  # empty trailing open tag does not erase it
        ("<action>\n</action>", None),
        ("go east", None),
        ("", None),
    ],
)
def test_parse_action(text, expected):
    assert parse_action(text) == expected


def test_parse_action_rejects_non_text():
    with pytest.raises(TypeError, match="str"):
        parse_action([1, 2])
