"""What longrunctl prints of a gateway's answer carries nothing a terminal would act on."""

from __future__ import annotations

from longrun_client.ctl_output import printable, render

HOSTILE = ("\x1b]0;pwned\x07\x1b[2J\x1b[1;31mred\x1b[0m \x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\"
           "\x9b31m\x1bc\x00\x08\r\x7f\x85\u202eexe.txt")


def test_escape_sequences_and_controls_are_stripped_from_every_string_keys_included() -> None:
    answer = {"run": {"input": HOSTILE, "list": [HOSTILE, 3, None, True]}, f"k{HOSTILE}": 1.5}
    cleaned = printable(answer)
    assert cleaned == {"run": {"input": "red linkexe.txt", "list": ["red linkexe.txt", 3, None, True]},
                       "kred linkexe.txt": 1.5}


def test_tab_newline_and_ordinary_unicode_stay() -> None:
    assert printable("a\tb\nc é 日本 ✓") == "a\tb\nc é 日本 ✓"


def test_an_unterminated_title_sequence_takes_the_rest_of_the_string() -> None:
    assert printable("before\x1b]0;title without end") == "before"


def test_every_format_prints_no_control_character() -> None:
    answer = printable({"reason": HOSTILE, "rows": [{"target": HOSTILE}]})
    for fmt in ("table", "json", "yaml"):
        shown = render(answer, fmt)
        assert not any(ord(c) < 32 and c not in "\t\n" or 0x7f <= ord(c) <= 0x9f for c in shown), fmt
        assert "\x1b" not in shown and "\\u001b" not in shown and "\u202e" not in shown, fmt
