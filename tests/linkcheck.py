"""Check that every relative link and image of a built static site resolves to a file."""

from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlparse


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.targets = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.targets.append(value)


def broken_links(root: Path) -> list[str]:
    broken = []
    for page in root.rglob("*.html"):
        parser = _Links()
        parser.feed(page.read_text())
        for target in parser.targets:
            url = urlparse(target)
            if url.scheme or target.startswith("#"):
                if url.scheme in ("http", "https"):
                    broken.append(f"{page}: external link {target}")
                continue
            if not (page.parent / url.path).resolve().exists():
                broken.append(f"{page}: {target}")
    return broken
