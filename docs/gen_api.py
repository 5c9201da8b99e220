#!/usr/bin/python3
"""Writes the C API reference (Markdown) from the public headers' comments.

Run by conf.py at every docs build, so the reference is the headers as they
are: each blank-line-separated block of a header becomes its comment as
prose and its declarations as C code; a "---- Title ----" comment starts a
section. Usage: gen_api.py OUT.md HEADER...
"""
import os
import re
import sys

EXTERN_RE = re.compile(r"HORA_EXTERN\b[^;(]*?\b(hora_\w+)\s*\(", re.S)
SECTION_RE = re.compile(r"^/\*\s*-{3,}\s*(.*?)\s*-{3,}\s*(\*/)?\s*$")
# Include guards, C++ linkage and the HORA_EXTERN macro itself are plumbing,
# not API.
PLUMBING_RE = re.compile(
    r"^(#\s*(if|ifdef|ifndef|else|endif|include)\b|#\s*define\s+(HORA_(MPI_|CUDA_)?H|HORA_EXTERN)\b"
    r"|extern \"C\" \{|\}$)")


def externs(text):
    """Names of the functions a header declares with HORA_EXTERN."""
    return EXTERN_RE.findall(text)


def comment_text(lines):
    """The text of a /* ... */ comment's lines, stars and delimiters removed."""
    out = []
    for line in lines:
        s = line.strip()
        s = re.sub(r"^/\*+", "", s)
        s = re.sub(r"\*+/$", "", s)
        s = re.sub(r"^\*(?!/)", "", s)
        # One space follows the star; more is the comment's own indentation.
        s = s[1:] if s.startswith(" ") else s
        out.append(s.rstrip())
    while out and not out[0].strip():
        out.pop(0)
    while out and not out[-1].strip():
        out.pop()
    return out


def prose(lines):
    """Comment lines as Markdown: paragraphs kept, list items and indented
    lines (pictures, formulas) kept as they are in a literal block."""
    text, indented, base = [], False, 0
    for s in lines:
        # Characters Markdown would take as markup; comments mean them literally.
        line = re.sub(r"([*_\[\]<>#|])", r"\\\1", s.strip()) if s.strip() else ""
        # An indented run (a list, a formula) keeps its inner indentation and
        # ends at the first line back at the margin: a blank line keeps that
        # line out of the run.
        if line and s.startswith(" "):
            indent = len(s) - len(s.lstrip(" "))
            base = base if indented else indent
            line = " " * max(0, indent - base) + line
            indented = True
        elif line and indented:
            text.append("")
            indented = False
        text.append(line)
    return "\n".join(text)


def split_blocks(text):
    blocks, cur = [], []
    for line in text.splitlines():
        if line.strip():
            cur.append(line)
        elif cur:
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    return blocks


def leading_comment(block):
    """(comment lines, code lines) of a block that may start with a comment."""
    if not block[0].lstrip().startswith("/*"):
        return [], block
    for i, line in enumerate(block):
        if "*/" in line:
            return block[: i + 1], block[i + 1:]
    return block, []


def render(path):
    name = os.path.basename(path)
    text = open(path, encoding="utf-8").read()
    out = ["## `<%s>`" % name, ""]
    blocks = split_blocks(text)
    # The file's opening comment says what the header is for.
    comment, code = leading_comment(blocks[0])
    out += [prose(comment_text(comment)), ""]
    blocks = ([code] if code else []) + blocks[1:]
    # Functions are headed one level below the section they are in.
    fn_level = "###"
    for block in blocks:
        comment, code = leading_comment(block)
        code = [l for l in code if not PLUMBING_RE.match(l.strip())]
        m = SECTION_RE.match(comment[0].strip()) if comment else None
        if m:
            out += ["### %s" % m.group(1), ""]
            fn_level = "####"
            body = comment_text(comment[1:]) if len(comment) > 1 else []
            if body:
                out += [prose(body), ""]
        elif comment and not code:
            body = comment_text(comment)
            if body:
                out += [prose(body), ""]
        if not code:
            continue
        names = externs("\n".join(code))
        if names:
            out += [fn_level + " " + ", ".join("`%s`" % n for n in names), ""]
        if comment and not m:
            out += [prose(comment_text(comment)), ""]
        out += ["```c"] + code + ["```", ""]
    return out


def main(argv):
    if len(argv) < 3:
        sys.stderr.write("usage: gen_api.py OUT.md HEADER...\n")
        return 2
    out = ["# C API reference", "",
           "Generated from the public headers at every docs build: the text is "
           "the headers' own comments, in the headers' order.", ""]
    for path in argv[2:]:
        out += render(path)
    data = "\n".join(out).rstrip() + "\n"
    # Rewritten only when it changes, so Sphinx does not rebuild it needlessly.
    old = open(argv[1], encoding="utf-8").read() if os.path.exists(argv[1]) else None
    if old != data:
        with open(argv[1], "w", encoding="utf-8") as f:
            f.write(data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
