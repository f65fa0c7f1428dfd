import pytest

from memdiag._errors import UserError
from memdiag.units import format_bytes, parse_rank_list, parse_size


@pytest.mark.parametrize("text,expected", [("512M", 512 * 2**20), ("2G", 2 * 2**30), ("1048576", 2**20),
                                           ("1.5k", 1536), ("3 GiB", 3 * 2**30)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "12Q", "-3M"])
def test_parse_size_rejects_garbage_with_a_hint(text):
    with pytest.raises(UserError, match="e.g. 512M"):
        parse_size(text)


def test_parse_rank_list():
    assert parse_rank_list("1,2, 4") == [1, 2, 4]
    for bad in ("0", "1,-2", "x", "1,,2"):
        with pytest.raises(UserError):
            parse_rank_list(bad)


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(1000 * 2**20) == "1000 MiB"
    assert format_bytes(-2 * 2**20) == "-2 MiB"
    assert format_bytes(None) == "-"
