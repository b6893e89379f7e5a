"""Model comparison statistics against Python's statistics module and hand counts."""

import statistics

import pytest
import torch

from fastvideo.eval.stats import Z95, markdown_table, reward_stats, table_rows


def test_mean_std_ci_match_the_statistics_module():
    x = torch.tensor([[1.0, 2.5], [0.5, 4.0], [3.0, 3.5]])
    st = reward_stats(x)
    values = x.reshape(-1).tolist()
    assert st.mean == pytest.approx(statistics.fmean(values))
    assert st.std == pytest.approx(statistics.stdev(values))
    assert Z95 == pytest.approx(statistics.NormalDist().inv_cdf(0.975))
    half = statistics.NormalDist().inv_cdf(0.975) * statistics.stdev(values) / len(values) ** 0.5
    assert st.ci95 == pytest.approx((st.mean - half, st.mean + half))
    assert st.win_rate is None and st.n == 6


def test_win_rate_counts_pairs_and_half_ties():
    ref = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    other = torch.tensor([[2.0, 2.0], [1.0, 5.0]])  # win, tie, loss, win
    assert reward_stats(other, ref).win_rate == pytest.approx(2.5 / 4)
    with pytest.raises(ValueError, match="same pairs"):
        reward_stats(other, ref[:1])


def test_table_rows_and_markdown():
    a = {"detail": torch.tensor([[1.0], [2.0]])}
    b = {"detail": torch.tensor([[3.0], [0.0]])}
    rows = table_rows(["base", "tuned"], [a, b])
    assert [(r["model"], r["win_rate"]) for r in rows] == [("base", None), ("tuned", 0.5)]
    md = markdown_table(rows, "base")
    assert "| tuned | detail | 1.5 |" in md and "50.0%" in md and "win rate vs base" in md
