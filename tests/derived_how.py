"""The check every test that runs a reproduction can make: the cells' how, derived by the code
that produced each number (components/provenance.py), adds up to the catalog's label, and a cell
has a how exactly when it has a number. tests/test_provenance.py makes sure every reproduction is
checked somewhere."""

from moe_repro.catalog import REPRODUCTIONS
from moe_repro.reproductions.spec import how_of


def assert_how_is_the_catalogs(rid: str, result) -> None:
    assert set(how_of(result.cells).split("+")) == REPRODUCTIONS[rid].how_letters, rid
    for cell in result.cells:
        assert (cell.how is None) == (cell.verdict == "not-reproduced"), (
            rid,
            cell.row,
            cell.column,
        )
