"""Compare two recorded runs and write an alignment report.

    python -m fastvideo.tools.compare_runs RUN_A RUN_B --out DIR [--reward_tol 0.05]
        [--max_iterations 200] [--psnr_min DB] [--loss_corr_min R] [--layer_tol TOL]

RUN_A / RUN_B: the --record_dir of two training runs (A is the reference, e.g. the GPU run), or
two probe folders. Writes DIR/report.md, DIR/summary.json and PNG plots. Exit status: 0 when the
runs align, 1 when they do not, 2 on a usage error (a missing or empty run folder, a bad flag).
See docs/alignment.md.
"""

from __future__ import annotations

import argparse
import sys

from fastvideo.alignment.compare import DEFAULT_LAYER_TOL, RunFolderError, Thresholds, compare_runs, parse_layer_tol
from fastvideo.errors import one_line_errors

EXIT_PASS, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m fastvideo.tools.compare_runs",
                                description="Compare two recorded runs (rewards, images, loss, layer probes).")
    p.add_argument("run_a", help="reference run folder (--record_dir of run A, e.g. the GPU run)")
    p.add_argument("run_b", help="run folder to check against A (e.g. the NPU run)")
    p.add_argument("--out", required=True, help="folder for report.md, summary.json and the plots")
    p.add_argument("--reward_tol", type=float, default=0.05,
                   help="maximum mean relative reward error per iteration (default 0.05, the article's 5%%)")
    p.add_argument("--max_iterations", type=int, default=200,
                   help="compare iterations up to this number (default 200, the article's window)")
    p.add_argument("--psnr_min", type=float, default=None,
                   help="fail when an image's PSNR is below this many dB (default: report only)")
    p.add_argument("--loss_corr_min", type=float, default=None,
                   help="fail when the Pearson correlation of the two loss series is below this (default: report only)")
    p.add_argument("--layer_tol", type=str, default=None,
                   help="probe relative-error tolerance: a number for every kind, or KIND=NUMBER pairs "
                        f"(default {','.join(f'{k}={v:g}' for k, v in DEFAULT_LAYER_TOL.items())})")
    p.add_argument("--reward_floor", type=float, default=1e-8,
                   help="smallest |reward| used as the denominator of the relative error")
    return one_line_errors(p)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # "not >=" also refuses NaN, which every comparison would silently pass.
    if not (args.reward_tol >= 0 and args.max_iterations >= 1 and args.reward_floor > 0):
        parser.error("--reward_tol must be >= 0, --max_iterations >= 1 and --reward_floor > 0")
    if any(v is not None and v != v for v in (args.psnr_min, args.loss_corr_min)):
        parser.error("--psnr_min and --loss_corr_min must be numbers, not nan")
    try:
        layer_tol = parse_layer_tol(args.layer_tol)
    except ValueError as exc:
        parser.error(str(exc))
    th = Thresholds(reward_tol=args.reward_tol, max_iterations=args.max_iterations, psnr_min=args.psnr_min,
                    loss_corr_min=args.loss_corr_min, layer_tol=layer_tol, reward_floor=args.reward_floor)
    from fastvideo.alignment.report import write_report

    try:
        cmp = compare_runs(args.run_a, args.run_b, th)
    except RunFolderError as exc:  # a UserError: the message alone (FASTVIDEO_DEBUG=1 adds the traceback)
        from fastvideo.errors import report_failure

        report_failure(exc, "compare_runs")
        return EXIT_USAGE
    report = write_report(cmp, args.out)
    verdict = "PASS" if cmp.passed else "FAIL"
    print(f"{verdict}: report in {report}")
    for c in cmp.checks:
        if c.passed is not None:
            print(f"  {c.name}: {'PASS' if c.passed else 'FAIL'} - {c.detail}")
    return EXIT_PASS if cmp.passed else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main())
