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


# Two-sided 95% and 99% points of Student's t (any statistics textbook's table, e.g. NIST/SEMATECH
# e-Handbook 1.3.6.7.2), to the table's 3 decimals.
T_TABLE = {1: (12.706, 63.657), 2: (4.303, 9.925), 3: (3.182, 5.841), 5: (2.571, 4.032), 10: (2.228, 3.169),
           30: (2.042, 2.750), 100: (1.984, 2.626)}


def test_t_quantile_matches_the_tables_and_the_normal_limit():
    from fastvideo.eval.stats import t_quantile

    for df, (t95, t99) in T_TABLE.items():
        assert t_quantile(0.95, df) == pytest.approx(t95, abs=6e-4)
        assert t_quantile(0.99, df) == pytest.approx(t99, abs=6e-4)
    normal = statistics.NormalDist()
    assert t_quantile(0.95, 200_001) == pytest.approx(normal.inv_cdf(0.975), abs=2e-5)
    assert t_quantile(0.95, 2) == pytest.approx(4.302652729749464, rel=1e-12)  # closed form for df 2
    with pytest.raises(ValueError):
        t_quantile(0.95, 0)


def test_paired_difference_averages_each_prompt_then_takes_a_t_interval():
    from fastvideo.eval.stats import paired_difference

    ref = torch.tensor([[1.0, 2.0], [0.0, 0.0], [5.0, 1.0], [2.0, 2.0]])
    # per-prompt differences (mean over the two images): 1.0, 0.5, -0.25, 2.0
    other = ref + torch.tensor([[1.5, 0.5], [0.0, 1.0], [-1.0, 0.5], [2.0, 2.0]])
    d = [1.0, 0.5, -0.25, 2.0]
    half = 3.182446305284263 * statistics.stdev(d) / 2  # t(0.975, 3) s / sqrt(4)
    diff = paired_difference(other, ref)
    assert diff.mean == pytest.approx(statistics.fmean(d)) and diff.prompts == 4
    assert diff.ci95 == pytest.approx((statistics.fmean(d) - half, statistics.fmean(d) + half), rel=1e-9)
    one = paired_difference(other[:1], ref[:1])
    assert one.mean == 1.0 and all(v != v for v in one.ci95)  # nan: one prompt has no spread
    with pytest.raises(ValueError, match="same pairs"):
        paired_difference(other, ref[:2])


def test_the_table_carries_the_paired_difference():
    a = {"detail": torch.tensor([[1.0], [2.0], [4.0]])}
    b = {"detail": torch.tensor([[2.0], [2.5], [4.5]])}
    rows = table_rows(["base", "tuned"], [a, b])
    assert rows[0]["diff_mean"] is None and rows[1]["diff_mean"] == pytest.approx(2 / 3)
    half = 4.302652729749464 * statistics.stdev([1.0, 0.5, 0.5]) / 3 ** 0.5
    assert rows[1]["diff_ci95_low"] == pytest.approx(2 / 3 - half)
    md = markdown_table(rows, "base")
    assert "difference vs base [95% t-CI, paired by prompt]" in md
    assert f"| +0.6667 [{2 / 3 - half:.4g}, {2 / 3 + half:.4g}] |" in md and md.splitlines()[2].endswith("| — |")
