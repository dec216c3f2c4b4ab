"""Text that comes from a dataset (class names, file names, image ids, paths), shown to people.

Datasets are written by strangers: a class may be named `<script>...</script>` or carry a
right-to-left override (U+202E) that reverses the line it is printed on, or terminal escapes
that retitle a terminal. One rule for every place such text is shown:

- `visible`: control characters (C0, DEL, C1) and the invisible formatting characters
  (bidi embeddings, overrides, isolates and marks; zero-width characters) written as `\\xNN` /
  `\\uNNNN`: a console line, a log line, a cell of a page shows what the text holds.
- `markdown_text`: `visible`, then HTML-escaped (a Markdown viewer renders inline HTML) and
  the Markdown marks of links, images, code and table cells escaped (a `|` would split a cell).
- `page_environment`: the one jinja2 environment of every HTML page: autoescape on, and every
  value `visible` before it is escaped.

Written here rather than taken from a library: `html.escape` and jinja2's autoescape stop markup
but leave bidi overrides and control characters as they are, and no well-kept library renders
them visible for a console.
"""

from __future__ import annotations

import html
import re

# Invisible characters that change how the text around them is displayed.
_FORMATTING = "\u061c\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ufeff"
_HIDDEN = re.compile(f"[\\x00-\\x1f\\x7f-\\x9f{_FORMATTING}]")
# What lets Markdown text become more than text: links and images ([...](...)), a table cell's
# end (|), code (`), and the backslash that escapes them. Emphasis (*, _) only changes the look.
_MARKDOWN = re.compile(r"([\\`\[\]|])")


def _escape(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, keep: str = "") -> str:
    r"""`text` with control and invisible formatting characters written out, but those in `keep`.

    >>> visible("raccoon"), visible("evil\u202egnp.exe"), visible("\x1b]0;pwned\x07title")
    ('raccoon', 'evil\\u202egnp.exe', '\\x1b]0;pwned\\x07title')
    >>> visible("two\nlines\x07", keep="\n")
    'two\nlines\\x07'
    """
    if keep:
        return _HIDDEN.sub(lambda m: m.group() if m.group() in keep else _escape(m), text)
    return _HIDDEN.sub(_escape, text)


def markdown_text(text: object) -> str:
    r"""`text` as Markdown that shows it as it is: no markup, no table split, no link.

    >>> markdown_text("<script>alert(1)</script>"), markdown_text("a|b ![x](http://y) image_size")
    ('&lt;script&gt;alert(1)&lt;/script&gt;', 'a\\|b !\\[x\\](http://y) image_size')
    """
    return _MARKDOWN.sub(r"\\\1", html.escape(visible(str(text)), quote=False))


def _finalize(value):
    # Markup (`|safe`, a value the code built as HTML) is the code's own, not the data's.
    return visible(value) if isinstance(value, str) and not hasattr(value, "__html__") else value


def page_environment(loader=None, **options):
    """The jinja2 environment of every HTML page detpipe writes: autoescape on for every
    template (from a file or a string), every string value made `visible` before it is escaped,
    undefined names an error."""
    import jinja2  # here: the Beam workers that import this module never render a page

    return jinja2.Environment(loader=loader, autoescape=True, finalize=_finalize,
                              undefined=jinja2.StrictUndefined, **options)
