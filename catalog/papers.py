"""The four papers this project reproduces: title, authors, venue, year, link and a citation.

Everything here is copied from the paper texts (papers/*.md beside DESIGN.md): the title and
author lines at the top of each, and the arXiv line where the text has one (Piper's arXiv
number is stated in piper-review.md). Where a text names no venue the venue is "preprint",
and where it gives no arXiv number or DOI the link is None; nothing is filled in from memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class Paper:
    """One paper: ``key`` is the prefix of its reproduction ids (``piper-table4``)."""

    key: str
    short: str  # the name used in tables: "Piper", "X-MoE"
    title: str
    authors: tuple[str, ...]
    venue: str  # "preprint" where the text names no venue
    year: int | None  # None where the text states no date
    link: str | None  # arXiv or DOI address, None where the text gives neither

    @property
    def citation_key(self) -> str:
        """BibTeX key: first author's family name, year (if known), paper key."""
        family = self.authors[0].split()[-1].lower()
        return f"{family}{self.year or ''}{self.key}"

    @property
    def bibtex(self) -> str:
        """A BibTeX entry built from the fields above, so it cannot disagree with them."""
        fields = [
            ("author", " and ".join(self.authors)),
            # double braces keep the title's capitals (MoE, HPC) as written
            ("title", "{" + self.title + "}"),
        ]
        if self.year is not None:
            fields.append(("year", str(self.year)))
        fields.append(("note", self.venue))
        if self.link is not None:
            fields.append(("url", self.link))
        body = "".join(f"  {name} = {{{value}}},\n" for name, value in fields)
        return f"@misc{{{self.citation_key},\n{body}}}"


_PAPERS = (
    Paper(
        key="piper",
        short="Piper",
        title="Piper: Efficient Large-Scale MoE Training via Resource Modeling and Pipelined "
        "Hybrid Parallelism",
        authors=("Sajal Dash", "Feiyi Wang"),
        # piper-review.md: "arXiv:2605.05049v1, 6 May 2026"
        venue="preprint",
        year=2026,
        link="https://arxiv.org/abs/2605.05049",
    ),
    Paper(
        key="xmoe",
        short="X-MoE",
        title="X-MoE: Enabling Scalable Training for Emerging Mixture-of-Experts Architectures "
        "on HPC Platforms",
        authors=(
            "Yueming Yuan",
            "Ahan Gupta",
            "Jianping Li",
            "Sajal Dash",
            "Feiyi Wang",
            "Minjia Zhang",
        ),
        # the text says the article was accepted for publication but names neither venue nor date
        venue="preprint",
        year=None,
        link=None,
    ),
    Paper(
        key="feplb",
        short="FEPLB",
        title="FEPLB: Exploiting Copy Engines for Nearly Free MoE Load Balancing in Distributed "
        "Training",
        authors=("Shuyao Qi", "Haoyuan Liu", "Shizhen Zhao"),
        # feplb.md: "arXiv:2604.19654v1 [cs.DC] 21 Apr 2026"
        venue="preprint",
        year=2026,
        link="https://arxiv.org/abs/2604.19654",
    ),
    Paper(
        key="mop",
        short="MoP",
        title="Mixture-of-Parallelisms: Towards Memory-Efficient Training Stack for "
        "Mixture-of-Experts Models",
        authors=(
            "Xuan-Phi Nguyen",
            "Shrey Pandit",
            "Yiran Zhao",
            "Semih Yavuz",
            "Silvio Savarese",
            "Shafiq Joty",
        ),
        venue="preprint",
        year=None,
        link=None,
    ),
)

PAPERS: MappingProxyType[str, Paper] = MappingProxyType({p.key: p for p in _PAPERS})
