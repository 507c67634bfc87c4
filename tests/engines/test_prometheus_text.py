"""The Prometheus text reader keeps wanted series only and names bad lines."""

from __future__ import annotations

import pytest

from engines.prometheus_text import MetricsParseError, MetricsText

PAGE = """# HELP a:x help text
# TYPE a:x gauge
a:x{k="1"} 2.5
a:x{k="2",other="quoted \\"v\\", with comma"} 1.5 1764440000000
a:x_suffix{k="1"} 100
a:bare 7
a:nan{k="1"} NaN
b:skipped{ this line is garbage but not wanted
"""


def test_wanted_series_are_summed_and_others_skipped() -> None:
    metrics = MetricsText.parse(PAGE, ["a:x", "a:bare", "a:missing"])
    assert metrics.total("a:x") == 4.0  # the timestamp is ignored
    assert metrics.total("a:bare") == 7.0
    assert metrics.total("a:missing") is None
    assert not metrics.has("a:x_suffix")
    assert metrics.total_by_label("a:x", "k") == {"1": 2.5, "2": 1.5}
    assert metrics.total_by_label("a:x", "other") == {'quoted "v", with comma': 1.5}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('a:x{k="1" 3', "unclosed label set"),
        ("a:x{k=1} 3", "bad label set"),
        ('a:x{k="1"}', "no value"),
        ('a:x{k="1"} three', "'three' is not a number"),
    ],
)
def test_a_malformed_wanted_line_is_named(line: str, message: str) -> None:
    with pytest.raises(MetricsParseError, match=message) as info:
        MetricsText.parse(f"# ok\n{line}\n", ["a:x"])
    assert "line 2" in str(info.value)
