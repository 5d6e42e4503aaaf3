"""User-supplied text on the dashboard's pages: shown as itself, never as Markdown.

``st.title``, ``st.caption``, ``st.info``/``warning``/``error``, ``st.markdown``, ``st.metric``
(label and value), expander and page-link labels all render GitHub-flavoured Markdown with
Streamlit's extras (``:red[…]`` colours, ``:icon:`` shortcodes, ``$…$`` maths). A job's name, id,
user, nodes, a profile's hints, a finding's node and GPU: all come from jobs, and any of them put
into one of those elements goes through :func:`plain`. Data frames and select boxes show text as
it is and need nothing.
"""

from __future__ import annotations

import re
from typing import Any, Final

_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
_SYNTAX: Final = re.compile(r"([\\`*{}\[\]()<>#+!|~$:&@^]|(?<![^\W_])_|_(?![^\W_]))")
"""ASCII punctuation that opens or closes inline Markdown: emphasis, code, links and images, raw
HTML and entities, tables, strikethrough, Streamlit's directives and maths, URL and e-mail
autolinks (the ``:`` of ``https:`` and the ``@``). ``-``, ``.``, ``,``, ``'``, ``"``, ``/``, ``%``,
``=``, ``;`` and ``?`` mean something only at the start of a line, and stay readable."""
_WWW_DOT: Final = re.compile(r"(?i)(?<![\w.])(www)\.")
_LINE_START: Final = re.compile(r"^(\d+)([.])|^([-=])")


def plain(value: Any) -> str:
    """Markdown source that shows ``str(value)`` literally, on one line: every character that
    could start markup is backslash-escaped (``**[x](https://evil)**`` shows its asterisks,
    brackets and parentheses, forms no link), the dot of ``www.`` too (no autolink), a leading
    ``-``, ``=`` or ``1.`` (no list, rule or heading), and line breaks become spaces."""
    text = _CONTROL.sub(" ", str(value)).strip()
    text = _SYNTAX.sub(r"\\\1", text)
    text = _WWW_DOT.sub(r"\1\\.", text)
    return _LINE_START.sub(lambda m: f"{m.group(1)}\\{m.group(2)}" if m.group(1) else f"\\{m.group(3)}", text)


def plain_join(values: Any, separator: str = ", ") -> str:
    """``values`` each :func:`plain`, joined."""
    return separator.join(plain(value) for value in values)
