"""Write a Comparison as plots (PNG), a Markdown report (report.md) and summary.json."""

from __future__ import annotations

import math
from pathlib import Path

from fastvideo.alignment.compare import Comparison, IterationComparison, ProbeComparison
from fastvideo.utils import atomic_write_json, atomic_write_text

REPORT = "report.md"
SUMMARY = "summary.json"
MAX_PROBE_ROWS = 60

# What to look at when the locator names a module of each kind (the article's checklist).
KIND_HINTS = {
    "rope": "RoPE (pos_embed): the frequency dtype (diffusers computes cos/sin in float64; on NPU the "
            "float32 path of patch 0002-feature-npu_rope_float32 is used), the position ids "
            "(img_ids / txt_ids dtype and layout), theta and axes_dims_rope, the cos/sin interleaving.",
    "norm": "Norms: RMSNorm eps and the dtype of its reduction (the fused NPU RMSNorm vs diffusers' "
            "RMSNorm), AdaLayerNorm shift/scale/gate order, whether the weight is applied in float32.",
    "attention": "Attention: the attention kernel and its layout (BNSD vs BSND), the softmax scale, any "
                 "mask, the q/k dtype after RoPE, the text-then-image token order; its q/k norms passed "
                 "if they are listed above it.",
    "block": "Transformer block (its probed children passed): the residual adds and gates, the "
             "feed-forward (GELU tanh approximation), the dtype of the residual stream.",
    "vae": "VAE decode: the VAE dtype (bf16 on accelerators), GroupNorm eps / float32 upcast, the "
           "upsampling interpolation, the latent scaling_factor / shift_factor before decoding.",
}


def _num(x, fmt: str = ".4g") -> str:
    if x is None:
        return "–"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    if isinstance(x, float) and math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return format(x, fmt)


def _json_safe(x):
    """JSON without NaN/Infinity tokens: inf -> "inf", nan -> null."""
    if isinstance(x, float):
        if math.isnan(x):
            return None
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    return x


# ---------------------------------------------------------------------------------- plots


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # iterations and module indices
    return plt, fig, ax


def _save(plt, fig, path: Path) -> Path:
    import io

    from fastvideo.alignment.recorder import atomic_write_bytes

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def plot_pair(x, ya, yb, title: str, ylabel: str, path: Path) -> Path:
    """Two series (run A, run B) against the iteration."""
    plt, fig, ax = _figure()
    ax.plot(x, ya, "o-", label="A (reference)")
    ax.plot(x, yb, "s--", label="B")
    ax.set(title=title, xlabel="iteration", ylabel=ylabel)
    ax.legend()
    return _save(plt, fig, path)


def plot_reward_error(its: list[IterationComparison], tol: float, path: Path) -> Path:
    plt, fig, ax = _figure()
    x = [c.iteration for c in its]
    ax.plot(x, [c.reward.mean_rel for c in its], "o-", label="mean over samples")
    ax.plot(x, [c.reward.max_rel for c in its], "^:", label="max over samples")
    ax.axhline(tol, color="red", linestyle="--", label=f"tolerance {tol:g}")
    ax.set(title="Reward relative error |B - A| / |A|", xlabel="iteration", ylabel="relative error")
    ax.legend()
    return _save(plt, fig, path)


def plot_psnr(its: list[IterationComparison], psnr_min: float | None, path: Path) -> Path:
    plt, fig, ax = _figure()
    rows = [(c.iteration, c.min_psnr) for c in its if c.images]
    # Identical images have infinite PSNR: draw them at a visible ceiling.
    ceiling = 100.0
    ax.plot([r[0] for r in rows], [min(r[1], ceiling) for r in rows], "o-",
            label=f"worst image (inf drawn at {ceiling:g})")
    if psnr_min is not None:
        ax.axhline(psnr_min, color="red", linestyle="--", label=f"minimum {psnr_min:g} dB")
    ax.set(title="Image PSNR, B against A", xlabel="iteration", ylabel="PSNR (dB)")
    ax.legend()
    return _save(plt, fig, path)


def plot_probes(p: ProbeComparison, path: Path) -> Path:
    plt, fig, ax = _figure()
    floor = 1e-12  # zero error drawn at the floor of the log axis
    x = list(range(len(p.entries)))
    ax.semilogy(x, [max(e.rel_err, floor) if math.isfinite(e.rel_err) else float("nan") for e in p.entries],
                "o-", markersize=3, label="relative error")
    ax.semilogy(x, [max(e.tol, floor) for e in p.entries], "r--", label="tolerance")
    f = p.first_failure
    if f is not None:
        i = p.entries.index(f)
        ax.axvline(i, color="orange", label=f"first over: {f.key}")
    ax.set(title="Layer probe: relative error per module (execution order)", xlabel="module index",
           ylabel="||B - A|| / ||A||")
    ax.legend(fontsize=8)
    return _save(plt, fig, path)


def write_plots(cmp: Comparison, out: Path) -> list[Path]:
    its = cmp.iterations
    paths = []
    if its:
        x = [c.iteration for c in its]
        paths.append(plot_pair(x, [c.reward.mean_a for c in its], [c.reward.mean_b for c in its],
                               "Mean reward of the common samples", "reward", out / "reward.png"))
        paths.append(plot_reward_error(its, cmp.thresholds.reward_tol, out / "reward_rel_error.png"))
        if cmp.loss.iterations:
            paths.append(plot_pair(cmp.loss.iterations, cmp.loss.loss_a, cmp.loss.loss_b, "GRPO loss", "loss",
                                   out / "loss.png"))
        if any(c.images for c in its):
            paths.append(plot_psnr(its, cmp.thresholds.psnr_min, out / "psnr.png"))
    if cmp.probes is not None and cmp.probes.entries:
        paths.append(plot_probes(cmp.probes, out / "probes.png"))
    return paths


# ---------------------------------------------------------------------------------- markdown


def _run_line(label: str, run) -> str:
    m = run.manifest or {}
    dev = m.get("device", {})
    return (f"- **{label}**: `{run.root}` — device {dev.get('type', '?')} ({dev.get('name', '?')}), "
            f"world size {m.get('world_size', '?')}, seed {m.get('seed', '?')}, commit "
            f"{(m.get('git_commit') or '?')[:12]}, {len(run.iterations)} iteration(s)"
            f"{', probes' if run.probe_dir else ''}")


def _iteration_table(its: list[IterationComparison]) -> list[str]:
    lines = ["| iteration | samples | reward A | reward B | rel. err. mean | rel. err. max | worst sample "
             "| min PSNR (dB) | max pixel diff | loss A | loss B |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in its:
        r = c.reward
        lines.append(f"| {c.iteration} | {r.n} | {_num(r.mean_a)} | {_num(r.mean_b)} | {_num(r.mean_rel, '.3g')} "
                     f"| {_num(r.max_rel, '.3g')} | {_num(r.worst_sample, 'd')} | {_num(c.min_psnr, '.2f')} "
                     f"| {_num(c.max_pixel_diff, 'd')} | {_num(c.loss_a)} | {_num(c.loss_b)} |")
    return lines


def _probe_section(p: ProbeComparison) -> list[str]:
    f = p.first_failure
    lines = ["## Layer probe", ""]
    a, b = p.meta_a, p.meta_b
    lines.append(f"Probe input: `{a.get('input')}`; A on {a.get('device_type')} ({a.get('device_name')}), "
                 f"B on {b.get('device_type')} ({b.get('device_name')}).")
    lines.append("")
    if f is None:
        lines.append(f"All {len(p.entries)} probed outputs agree within tolerance.")
    else:
        lines.append(f"**First diverging module (execution order): `{f.key}`** — kind **{f.kind}**, "
                     f"relative error {_num(f.rel_err, '.3g')} (tolerance {f.tol:g}, status {f.status}).")
        lines.append("")
        lines.append(f"What to check: {KIND_HINTS[f.kind]}")
    lines += ["", "| # | output | kind | rel. err. | tol. | status |", "|---:|---|---|---:|---:|---|"]
    stop = len(p.entries) if f is None else p.entries.index(f) + 6
    shown = p.entries[:min(stop, MAX_PROBE_ROWS)]
    for i, e in enumerate(shown):
        mark = "**" if e is f else ""
        lines.append(f"| {i} | {mark}`{e.key}`{mark} | {e.kind} | {_num(e.rel_err, '.3g')} | {e.tol:g} | {e.status} |")
    if len(shown) < len(p.entries):
        lines.append(f"| … | {len(p.entries) - len(shown)} more in summary.json | | | | |")
    later = [e.key for e in p.entries[len(shown):] if e.failed]
    if later:
        more = f" and {len(later) - 8} more" if len(later) > 8 else ""
        lines += ["", f"Also over tolerance further on: {', '.join(f'`{k}`' for k in later[:8])}{more} "
                  "(often consequences of the first divergence)."]
    return lines


def render_markdown(cmp: Comparison, plots: list[Path]) -> str:
    th = cmp.thresholds
    verdict = "PASS" if cmp.passed else "FAIL"
    lines = ["# Run comparison", "", _run_line("A (reference)", cmp.run_a), _run_line("B", cmp.run_b), "",
             f"## Verdict: **{verdict}**", ""]
    for c in cmp.checks:
        state = "not judged" if c.passed is None else ("PASS" if c.passed else "FAIL")
        lines.append(f"- **{c.name}**: {state} — {c.detail}")
    if not any(c.passed is not None for c in cmp.checks):
        lines.append("- nothing could be judged: the runs share no iteration and no probes")
    psnr = "not judged" if th.psnr_min is None else f">= {th.psnr_min:g} dB"
    corr = "not judged" if th.loss_corr_min is None else f"Pearson r >= {th.loss_corr_min:g}"
    lines += ["", f"Thresholds: reward relative error (mean over samples) <= {th.reward_tol:g} over iterations "
              f"<= {th.max_iterations}; image PSNR {psnr}; loss trend {corr}; layer tolerances {th.layer_tol}."]
    if cmp.warnings:
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in cmp.warnings]
    if cmp.iterations:
        lines += ["", "## Per iteration", ""] + _iteration_table(cmp.iterations)
        lines += ["", "## Loss trend", "",
                  f"Pearson r of the loss series: {_num(cmp.loss.corr, '.3f')}; of their first differences: "
                  f"{_num(cmp.loss.diff_corr, '.3f')} ({len(cmp.loss.iterations)} iterations). The article asks "
                  "only that the loss agree in trend, not in value."]
        per = cmp.iterations[-1].reward.per_reward
        if per:
            lines += ["", f"Per reward, last iteration ({cmp.iterations[-1].iteration}): " + "; ".join(
                f"{k}: mean rel. err. {_num(v['mean_rel'], '.3g')}, max {_num(v['max_rel'], '.3g')}"
                for k, v in per.items())]
    tensors = [(c.iteration, c.tensors) for c in cmp.iterations if c.tensors]
    if tensors:
        lines += ["", "## Recorded tensors", "", "| iteration | initial noise max rel. err. | final latents max "
                  "rel. err. |", "|---:|---:|---:|"]
        lines += [f"| {i} | {_num(t['initial_noise_max_rel'], '.3g')} | {_num(t['latents_final_max_rel'], '.3g')} |"
                  for i, t in tensors]
    if cmp.probes is not None:
        lines += [""] + _probe_section(cmp.probes)
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots]
    if cmp.config_diff:
        lines += ["", "## Config differences (paths ignored)", "", "| key | A | B |", "|---|---|---|"]
        lines += [f"| {k} | {a} | {b} |" for k, (a, b) in cmp.config_diff.items()]
    return "\n".join(lines) + "\n"


def summary_dict(cmp: Comparison, plots: list[Path]) -> dict:
    from dataclasses import asdict

    return _json_safe({
        "verdict": "PASS" if cmp.passed else "FAIL",
        "passed": cmp.passed,
        "run_a": str(cmp.run_a.root),
        "run_b": str(cmp.run_b.root),
        "thresholds": asdict(cmp.thresholds),
        "checks": [asdict(c) for c in cmp.checks],
        "warnings": cmp.warnings,
        "iterations": [
            {"iteration": c.iteration, "reward": asdict(c.reward), "min_psnr": c.min_psnr,
             "max_pixel_diff": c.max_pixel_diff, "images": [asdict(d) for d in c.images],
             "loss_a": c.loss_a, "loss_b": c.loss_b, "tensors": c.tensors}
            for c in cmp.iterations
        ],
        "loss_trend": asdict(cmp.loss),
        "probes": None if cmp.probes is None else {
            "first_failure": None if cmp.probes.first_failure is None else asdict(cmp.probes.first_failure),
            "entries": [asdict(e) for e in cmp.probes.entries],
        },
        "config_diff": cmp.config_diff,
        "plots": [p.name for p in plots],
    })


def write_report(cmp: Comparison, out_dir: str | Path) -> Path:
    """Write plots, report.md and summary.json into ``out_dir``; returns report.md's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(cmp, out)
    atomic_write_json(out / SUMMARY, summary_dict(cmp, plots))
    atomic_write_text(out / REPORT, render_markdown(cmp, plots))
    return out / REPORT
