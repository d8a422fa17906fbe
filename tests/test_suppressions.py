from __future__ import annotations

import textwrap
import tokenize

from graphify.suppressions import parse_suppressions


def sup(source: str):
    return parse_suppressions(textwrap.dedent(source).lstrip("\n"))


def test_trailing_comment_with_codes():
    s = sup("""
        x = loss.item()  # graphify: ignore[GFY001, GFY511]
        y = loss.item()
    """)
    assert s.suppressed("GFY001", 1)
    assert s.suppressed("GFY511", 1)
    assert not s.suppressed("GFY002", 1)
    assert not s.suppressed("GFY001", 2)


def test_bare_ignore_suppresses_everything_on_its_line():
    s = sup("x = loss.item()  # graphify: ignore\n")
    assert s.suppressed("GFY001", 1)
    assert s.suppressed("GFY999", 1)


def test_prefix_spacing_case_and_reason():
    s = sup("x = a.item()  #graphify:ignore [gfy0 ] -- eval loop, on purpose\n")
    assert s.suppressed("GFY001", 1)
    assert s.suppressed("GFY011", 1)
    assert not s.suppressed("GFY101", 1)


def test_after_another_tool_comment():
    s = sup("x = a.item()  # noqa: E501  # graphify: ignore[GFY001]\n")
    assert s.suppressed("GFY001", 1)


def test_empty_brackets_suppress_nothing():
    s = sup("x = a.item()  # graphify: ignore[]\n")
    assert not s.suppressed("GFY001", 1)


def test_unclosed_brackets_suppress_nothing():
    """Read as a bare ignore, a half-typed list would silence every rule on its line."""
    s = sup("x = a.item()  # graphify: ignore[GFY001\ny = a.item()  # graphify: ignore[\n")
    assert not s.suppressed("GFY001", 1) and not s.suppressed("GFY001", 2)


def test_own_line_comment_applies_to_next_code_line():
    s = sup("""
        for x in loader:
            # graphify: ignore[GFY001]
            # graphify: ignore[GFY006]

            print(loss.item())
            y = loss.item()
    """)
    assert s.suppressed("GFY001", 5)
    assert s.suppressed("GFY006", 5)
    assert not s.suppressed("GFY001", 2)
    assert not s.suppressed("GFY001", 6)


def test_multi_line_statement_trailing_comment_on_first_line():
    s = sup("""
        log(  # graphify: ignore[GFY006]
            loss,
            acc.item(),
        )
        z = 1
    """)
    for line in (1, 2, 3, 4):
        assert s.suppressed("GFY006", line)
    assert not s.suppressed("GFY006", 5)


def test_trailing_comment_on_a_later_line_covers_only_that_line():
    s = sup("""
        log(
            loss.item(),  # graphify: ignore[GFY001]
            acc.item(),
        )
    """)
    assert s.suppressed("GFY001", 2)
    assert not s.suppressed("GFY001", 1)
    assert not s.suppressed("GFY001", 3)


def test_own_line_comment_before_multi_line_statement_covers_it():
    s = sup("""
        # graphify: ignore[GFY001]
        total = (loss.item()
                 + acc.item())
        other = x.item()
    """)
    assert s.suppressed("GFY001", 2)
    assert s.suppressed("GFY001", 3)
    assert not s.suppressed("GFY001", 4)


def test_own_line_comment_inside_brackets_applies_to_next_line():
    s = sup("""
        log(
            # graphify: ignore[GFY001]
            loss.item(),
            acc.item(),
        )
    """)
    assert s.suppressed("GFY001", 3)
    assert not s.suppressed("GFY001", 4)
    assert not s.suppressed("GFY001", 1)


def test_compound_statement_header_does_not_cover_body():
    s = sup("""
        for x in loader:  # graphify: ignore[GFY101]
            if loss > 0:
                pass
    """)
    assert s.suppressed("GFY101", 1)
    assert not s.suppressed("GFY101", 2)


def test_strings_are_not_comments():
    s = sup('''
        a = "x.item()  # graphify: ignore"
        b = """
        # graphify: ignore[GFY001]
        """
        c = loss.item()
    ''')
    assert not s
    for line in range(1, 6):
        assert not s.suppressed("GFY001", line)


def test_crlf_and_windows_sources():
    s = parse_suppressions("import torch\r\n# graphify: ignore[GFY001]\r\nx = a.item()\r\n")
    assert s.suppressed("GFY001", 3)


def test_untokenizable_source_keeps_what_was_read():
    s = parse_suppressions("x = a.item()  # graphify: ignore\ny = (\n")
    assert s.suppressed("GFY001", 1)
    s = parse_suppressions('x = a.item()  # graphify: ignore\ny = "unterminated\n')
    assert s.suppressed("GFY001", 1)


def test_sources_without_directive_are_not_tokenized(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("tokenized")

    monkeypatch.setattr(tokenize, "generate_tokens", boom)
    s = parse_suppressions("import torch\nx = loss.item()  # noqa\n" * 1000)
    assert not s.suppressed("GFY001", 2)


def test_tokenized_lazily_and_once(monkeypatch):
    calls = []
    real = tokenize.generate_tokens

    def counting(readline):
        calls.append(1)
        return real(readline)

    monkeypatch.setattr(tokenize, "generate_tokens", counting)
    s = parse_suppressions("x = a.item()  # graphify: ignore\n")
    assert calls == []
    assert s.suppressed("GFY001", 1)
    assert s.suppressed("GFY002", 1)
    assert calls == [1]


def test_noqa_with_graphify_codes_is_an_alias_and_others_are_left_alone():
    from graphify.suppressions import parse_suppressions

    s = parse_suppressions("x = 1  # noqa: GFY001, E501\ny = 2  # noqa\nz = 3  # noqa: E501\n")
    assert s.suppressed("GFY001", 1) and not s.suppressed("GFY002", 1)
    assert not s.suppressed("GFY001", 2) and not s.suppressed("GFY001", 3)


def test_ignore_file_suppresses_every_line():
    from graphify.suppressions import parse_suppressions

    s = parse_suppressions("import torch\n# graphify: ignore-file\nx = 1\n\n\ny = 2\n")
    assert s.suppressed("GFY001", 3) and s.suppressed("GFY611", 6)
    assert not parse_suppressions("x = 1  # graphify: ignore-files-please\n").suppressed("GFY001", 1)
