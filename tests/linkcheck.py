"""Check that every relative link and image of a built static site resolves to a file, and that
no page loads anything from the network (an external ``src`` or stylesheet); links a reader may
follow to a paper (``<a href="https://arxiv.org/...">``) make no request and are allowed."""

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
                self.targets.append((tag, value))


def broken_links(root: Path) -> list[str]:
    broken = []
    for page in root.rglob("*.html"):
        parser = _Links()
        parser.feed(page.read_text())
        for tag, target in parser.targets:
            url = urlparse(target)
            if url.scheme or target.startswith("#"):
                if url.scheme in ("http", "https") and tag != "a":
                    broken.append(f"{page}: loads {target} from the network")
                continue
            if not (page.parent / url.path).resolve().exists():
                broken.append(f"{page}: {target}")
    return broken
