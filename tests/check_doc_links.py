#!/usr/bin/env python3
"""Fails when a relative link of the reference docs leads nowhere.

    tests/check_doc_links.py SOURCE_DIR

Reads README.md and docs/*.md (not docs/notes/, which is dated history). For
every inline Markdown link [text](target) outside code (fenced blocks and
`inline code` are skipped) whose target is relative (no scheme, not mailto:):

  - the file it names exists (relative to the linking file; a bare #anchor
    names the linking file itself);
  - when it names a Markdown file and an anchor, the anchor is the slug of a
    heading of that file, by GitHub's rules: lowercased, every character
    that is not a letter, digit, space, '-' or '_' dropped, spaces turned to
    '-', and a repeated slug suffixed -1, -2, ... in order.

Prints one "FAIL: file:line: why" per broken link and a summary; exits 1 on
any failure or when it finds fewer than 10 links, so that it cannot pass by
reading nothing.
"""
import os
import re
import sys

MIN_LINKS = 10
LINK = re.compile(r'(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+"[^"]*")?\)')
IMAGE = re.compile(r'!\[[^\]]*\]\(([^()\s]+)\)')
FENCE = re.compile(r'^\s*(```|~~~)')
HEADING = re.compile(r'^(#{1,6})\s+(.*?)\s*#*\s*$')


def unfenced_lines(path):
    """Yields (line number, text) of the lines outside fenced blocks."""
    fence = None
    with open(path, encoding='utf-8') as f:
        for n, line in enumerate(f, 1):
            m = FENCE.match(line)
            if m:
                if fence is None:
                    fence = m.group(1)
                elif m.group(1) == fence:
                    fence = None
                continue
            if fence is None:
                yield n, line


def code_free_lines(path):
    """Yields (line number, text) of the lines outside fenced blocks, with
    inline code spans blanked out."""
    for n, line in unfenced_lines(path):
        yield n, re.sub(r'`[^`]*`', lambda c: ' ' * len(c.group(0)), line)


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading)  # a link's text only
    text = text.lower()
    text = ''.join(c for c in text if c.isalnum() or c in ' -_')
    return text.replace(' ', '-')


anchor_cache = {}


def anchors(path):
    """The set of anchors GitHub gives the headings of a Markdown file."""
    if path not in anchor_cache:
        seen = {}
        result = set()
        for _, line in unfenced_lines(path):
            h = HEADING.match(line)
            if not h:
                continue
            base = slug(h.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else f'{base}-{count}')
        anchor_cache[path] = result
    return anchor_cache[path]


def main():
    if len(sys.argv) != 2:
        print(f'usage: {sys.argv[0]} SOURCE_DIR', file=sys.stderr)
        return 2
    root = sys.argv[1]
    docs = os.path.join(root, 'docs')
    files = [os.path.join(root, 'README.md')] + sorted(
        os.path.join(docs, name) for name in os.listdir(docs) if name.endswith('.md'))
    checked = failures = 0
    for path in files:
        rel = os.path.relpath(path, root)
        for n, line in code_free_lines(path):
            for m in list(LINK.finditer(line)) + list(IMAGE.finditer(line)):
                target = m.group(1)
                if re.match(r'^[a-zA-Z][a-zA-Z0-9+.-]*:', target):
                    continue  # http:, https:, mailto: and the like
                checked += 1
                file_part, _, anchor = target.partition('#')
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
                    if file_part else path
                if not os.path.exists(dest):
                    print(f'FAIL: {rel}:{n}: {target}: no file {os.path.relpath(dest, root)}')
                    failures += 1
                    continue
                if anchor and dest.endswith('.md') and anchor not in anchors(dest):
                    print(f'FAIL: {rel}:{n}: {target}: no heading with anchor #{anchor} '
                          f'in {os.path.relpath(dest, root)}')
                    failures += 1
    print(f'{checked} relative links checked, {failures} broken')
    if checked < MIN_LINKS:
        print(f'FAIL: fewer than {MIN_LINKS} links found')
        return 1
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
