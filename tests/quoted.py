"""What the book quotes of the code's messages, and whether the code can still print them.

A message quoted in the prose (the troubleshooting table's "What you see", an error named in a chapter or
in the README) must be one the code can raise or print: the book once quoted "parameter 'p' has no
gradient on rank R ... all ranks must have one" long after the code had stopped raising it.

``quotes(markdown)``: the inline code of a Markdown text that reads as a message (four words or more;
not Python, not a command). ``templates(files)``: every string literal of those Python files, each
f-string field a wildcard. ``source_of(quote, files)``: the literal the quote is an instance of, or None.

How a quote is matched: it may name a value by a placeholder (``R``, ``N``, ``'p'``: one field of the literal, or one
word) or leave a part out (``...``, ``…``, ``[...]``: any stretch of it). A field of the literal matches one
value as the quote writes it (``bfloat16``, ``SIGKILL``, ``rank 3 (dp 1, tp 1)``), or another literal's
message (the code composes some messages from two: "was killed by signal {}" + ", with no Python
traceback"). At least 60% of what the quote says must be the literal's own fixed text.
"""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

FIELD, GAP, VALUE = "\x00", "\x01", "\x02"
# A part left out (GAP: any stretch of the literal): an ellipsis, alone or in brackets.
LEFT_OUT = re.compile(r"[\[(]\.\.\.[\])]|\.\.\.|…")
# A value named by a placeholder (VALUE: one field, or one word of the literal): a quoted or standalone
# capital letter (rank R, size S), and the lower-case letters the book uses as names (k, n, d, p).
NAMED = re.compile(r"'[A-Za-z]'|\b[A-Z]\b|\b[dknp]\b")
COMMAND = re.compile(r"^(python|torchrun|make|pip|git|bash|\.venv|jupyter|cd)\b|(^|\s)--?\w")
MIN_COVERAGE = 0.6
MIN_WORDS_EACH = 2   # a quote read as two messages: each part says at least this much


def quotes(markdown: str) -> list[str]:
    """The inline code of ``markdown`` that reads as a message: four words or more, not a command, not
    Python (an expression or a statement), not the target of a MyST role (``{term}`x <y>```)."""
    from markdown_it import MarkdownIt

    found = []
    for block in MarkdownIt("commonmark").enable("table").parse(markdown):
        children = block.children or []
        for k, tok in enumerate(children):
            span = tok.content.strip()
            if tok.type != "code_inline" or len(span.split()) < 4 or COMMAND.search(span) or "{" in span:
                continue
            if k and children[k - 1].type == "text" and children[k - 1].content.endswith("}"):
                continue
            try:
                ast.parse(span)
                continue
            except SyntaxError:
                found.append(span)
    return found


def _template(node) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else FIELD for v in node.values)
    return None


def _docstrings(tree) -> set[int]:
    """ids of the docstring nodes of a module, its classes and functions (prose, not messages)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


@lru_cache(maxsize=None)
def templates(files: tuple[Path, ...]) -> tuple[str, ...]:
    """Every string literal of ``files`` that could be a message: four characters of fixed text or more,
    at most 400 in all, not a docstring."""
    out = set()
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            t = _template(node)
            if t and id(node) not in skip and 4 <= len(t.replace(FIELD, "")) and len(t) <= 400:
                out.add(t)
    return tuple(sorted(out))


def _pattern(quote: str) -> str:
    """The quote with each part left out as a GAP and each named value as a VALUE."""
    pattern = NAMED.sub(VALUE, LEFT_OUT.sub(GAP, quote))
    return re.sub(r"\s*" + GAP + r"\s*", GAP, pattern).strip()


def coverage(pattern: str, template: str, whole_start: bool = False, whole_end: bool = False) -> int:
    """The most characters of ``pattern`` (a quote, its placeholders GAPs; spaces not counted) matched by
    the template's fixed text, reading the pattern as a piece of an instance of ``template``; -1 if it is
    no such piece. A GAP matches any stretch of the template, a FIELD any text.
    ``whole_start``/``whole_end``: the piece starts at the template's start or right after a field / ends at
    its end or right before a field (where another message joins it)."""
    n = len(template)
    prev = [0 if not whole_start or j == 0 or template[j - 1] == FIELD else -1 for j in range(n + 1)]
    for ch in pattern:
        cur = [-1] * (n + 1)
        if ch == GAP:
            cur[0] = prev[0]
        for j in range(1, n + 1):
            t = template[j - 1]
            if ch == GAP:
                cur[j] = max(prev[j], cur[j - 1])
            elif ch == VALUE:   # a field (or part of one), or a word of fixed text: it counts for nothing
                cur[j] = max(prev[j - 1], prev[j]) if t == FIELD else _word_before(template, j, prev)
            elif t == FIELD:
                cur[j] = max(prev[j], cur[j - 1])
            elif t == ch and prev[j - 1] >= 0:
                cur[j] = prev[j - 1] + (ch != " ")
        prev = cur
    if whole_end:
        return max(prev[j] for j in range(n + 1) if j == n or template[j] == FIELD)
    return max(prev)


def _word_before(template: str, j: int, prev: list[int]) -> int:
    """The best ``prev[i]`` from which the fixed text ``template[i:j]`` is one word (no space, no field)."""
    best, i = -1, j - 1
    while i >= 0 and template[i] not in (" ", FIELD):
        best = max(best, prev[i])
        i -= 1
    return best


def _said(pattern: str) -> int:
    """How much the pattern says in words: its characters but spaces, placeholders and the values it
    spells out (a token with a digit or an underscore, or in capitals: ``float32``, ``1937``,
    ``grad_reduce_scatter``, ``SIGKILL``), which a literal's fields stand for."""
    tokens = pattern.replace(GAP, " ").replace(VALUE, " ").split()
    return sum(len(t) for t in tokens if not re.search(r"[\d_]", t) and not re.fullmatch(r"[A-Z]{2,}\W*", t))


def _words(pattern: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z]{4,}", pattern)}


@lru_cache(maxsize=None)
def _best(pattern: str, pool: tuple[str, ...], **anchors) -> tuple[str | None, int]:
    """The template of ``pool`` with the best coverage of ``pattern`` (among those holding at least half
    of its long words: a field may hold the others)."""
    words = _words(pattern)
    best, score = None, -1
    for t in pool:
        low = t.lower()
        if 2 * sum(w in low for w in words) < len(words):
            continue
        c = coverage(pattern, t, **anchors)
        if c > score:
            best, score = t, c
    return best, score


def source_of(quote: str, files: tuple[Path, ...]) -> str | None:
    """The literal of ``files`` that ``quote`` is an instance of (or the first of the two it is made of)."""
    pattern = _pattern(quote)
    words = _words(pattern)
    pool = tuple(t for t in templates(files) if any(w in t.lower() for w in words))
    t, c = _best(pattern, pool)
    if t is not None and c >= MIN_COVERAGE * _said(pattern):
        return t
    # two messages joined: the first ends where the second begins (one fills a field of the other, or
    # the code puts them side by side), each at least two words; they meet at a separator or a GAP
    for m in re.finditer("[ ,;:" + GAP + "]", pattern):
        if m.group() == GAP:
            splits = [(pattern[:m.end()], pattern[m.start():])]
        else:
            splits = [(pattern[:m.start()], pattern[m.start():])]
            if m.group() == " ":
                splits.append((pattern[:m.start()], pattern[m.end():]))
        for head, tail in splits:
            if min(len(re.findall(r"[A-Za-z]{2,}", x)) for x in (head, tail)) < MIN_WORDS_EACH:
                continue
            t1, c1 = _best(head, pool, whole_end=True)
            t2, c2 = _best(tail, pool, whole_start=True)
            if t1 and t2 and min(c1, c2) >= 0 and c1 + c2 >= MIN_COVERAGE * _said(pattern):
                return t1
    return None
