"""bench/RESULTS.md as sections (each starts with a `## ` title): a benchmark replaces its own sections and keeps
everyone else's."""

from __future__ import annotations

import os

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")


def read_sections(path: str = PATH) -> tuple[str, dict[str, str]]:
    """(the text before the first section, {title line: section text})."""
    if not os.path.exists(path):
        return "", {}
    with open(path) as f:
        text = f.read()
    header, sections, title = [], {}, None
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            title = line.rstrip("\n")
            sections[title] = line
        elif title is None:
            header.append(line)
        else:
            sections[title] += line
    return "".join(header), sections


def replace_section(title: str, text: str, header: str | None = None, path: str = PATH) -> None:
    """Put `text` (starting with its `## ` title line) in place of the section of that title, or at the end."""
    write_sections({title: text}, header, path)


def write_sections(new: dict[str, str], header: str | None = None, path: str = PATH) -> None:
    old_header, sections = read_sections(path)
    sections = {title: text.rstrip("\n") + "\n\n" for title, text in sections.items()}
    for title, text in new.items():
        sections[title.rstrip("\n")] = text.rstrip("\n") + "\n\n"
    with open(path, "w") as f:
        f.write(header if header is not None else old_header)
        f.write("".join(sections.values()).rstrip("\n") + "\n")
