"""Compare two recorded runs (see fastvideo.alignment.recorder) and judge whether they align.

Run A is the reference (e.g. the GPU run); relative errors are taken against A:
``|a - b| / max(|a|, floor)`` for rewards and ``||a - b|| / ||a||`` for probe tensors.

Criteria (the article's end-to-end standard; thresholds in :class:`Thresholds`):

- rewards: the per-iteration mean (over samples) relative error of the reward stays below
  ``reward_tol`` (5%) over the first ``max_iterations`` (200) iterations; samples are matched
  by global sample id and must carry the same caption;
- images (only with ``psnr_min``): the worst image of each iteration (matched by file name) has
  a PSNR of at least ``psnr_min`` dB;
- loss (only with ``loss_corr_min``): the loss need only agree in trend, judged by the Pearson
  correlation of the two loss series;
- layers (when both runs hold probes): no probed module's output differs by more than its
  kind's tolerance; the first one that does, in execution order, is named.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fastvideo.alignment import probes as probes_mod
from fastvideo.alignment.measures import pearson, psnr, relative_errors  # noqa: F401  (part of this module's API)
from fastvideo.errors import UserError
from fastvideo.utils import flatten_dict
from fastvideo.alignment.recorder import IMAGES, MANIFEST, METRICS

# Relative-error tolerance per probe kind. The probes run in the models' dtypes (fp32 master
# weights): fp32 noise between devices is ~1e-6..1e-4 (1e-3 with TF32), an implementation
# mismatch is ~1e-2 or more. RoPE has no matmul, so it is held tighter; the VAE runs in bf16 on
# accelerators, so it gets more room.
DEFAULT_LAYER_TOL = {"rope": 1e-3, "norm": 1e-2, "attention": 1e-2, "block": 1e-2, "vae": 5e-2}
NOISE_MATCH_TOL = 1e-6  # initial noise is drawn on the CPU: it should agree exactly


class RunFolderError(UserError, ValueError):
    """A path given as a run folder is missing or holds no record (a usage error)."""


@dataclass
class Thresholds:
    reward_tol: float = 0.05
    max_iterations: int = 200
    psnr_min: float | None = None
    loss_corr_min: float | None = None
    layer_tol: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_LAYER_TOL))
    reward_floor: float = 1e-8  # keeps the relative error finite for rewards at 0


def parse_layer_tol(text: str | None) -> dict[str, float]:
    """'1e-3' (every kind), 'rope=1e-4,vae=0.1' (those kinds) or both ('1e-3,vae=0.1');
    kinds not named keep DEFAULT_LAYER_TOL."""
    tol = dict(DEFAULT_LAYER_TOL)
    if not text:
        return tol
    for part in (p.strip() for p in text.split(",") if p.strip()):
        kind, sep, value = part.partition("=")
        try:
            number = float(value if sep else kind)
        except ValueError:
            raise ValueError(f"--layer_tol: {part!r} is not a number or KIND=NUMBER") from None
        if number < 0:
            raise ValueError(f"--layer_tol: {part!r} must not be negative")
        if not sep:
            tol = {k: number for k in tol}
        elif kind.strip() not in tol:
            raise ValueError(f"--layer_tol: unknown kind {kind.strip()!r}; valid: {', '.join(tol)}")
        else:
            tol[kind.strip()] = number
    return tol


# ---------------------------------------------------------------------------------- loading


@dataclass
class IterationRecord:
    iteration: int
    samples: dict[int, dict]  # global sample id -> sample record
    metrics: dict | None
    images: dict[str, Path]  # file name -> path
    tensor_files: list[Path]


@dataclass
class RunRecord:
    root: Path
    manifest: dict | None
    iterations: dict[int, IterationRecord]
    probe_dir: Path | None
    warnings: list[str] = field(default_factory=list)


def load_run(path: str | Path) -> RunRecord:
    root = Path(path)
    if not root.is_dir():
        raise RunFolderError(f"run folder {str(root)!r} does not exist; give the --record_dir of a recorded run")
    manifest = json.loads((root / MANIFEST).read_text()) if (root / MANIFEST).is_file() else None
    warnings = []
    iterations = {}
    for folder in sorted(root.glob("iter_*")):
        if not folder.is_dir() or not folder.name[5:].isdigit():
            continue
        it = int(folder.name[5:])
        samples: dict[int, dict] = {}
        for f in sorted(folder.glob("samples_rank*.json")):
            for s in json.loads(f.read_text())["samples"]:
                if s["sample_id"] in samples:
                    warnings.append(f"{root.name}: iteration {it}: sample {s['sample_id']} recorded twice")
                samples[int(s["sample_id"])] = s
        metrics = json.loads((folder / METRICS).read_text()) if (folder / METRICS).is_file() else None
        images = {p.name: p for p in sorted((folder / IMAGES).glob("*.png"))}
        tensors = sorted(folder.glob("tensors_rank*.safetensors"))
        iterations[it] = IterationRecord(it, samples, metrics, images, tensors)
    probe_dir = probes_mod.find_probe_dir(root)
    if not iterations and probe_dir is None:
        raise RunFolderError(
            f"{str(root)!r} holds no recorded iterations (iter_*/) and no probes; record a run with "
            "--record_dir (and --probe_layers for probes)"
        )
    return RunRecord(root, manifest, iterations, probe_dir, warnings)


# ---------------------------------------------------------------------------------- measures


def _read_png(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


# ---------------------------------------------------------------------------------- per iteration


@dataclass
class RewardDiff:
    n: int  # samples present in both runs
    mean_a: float
    mean_b: float
    mean_rel: float  # mean over samples of the relative error of the total reward
    max_rel: float
    worst_sample: int | None
    per_reward: dict[str, dict[str, float]]  # name -> {mean_rel, max_rel}
    only_in_a: list[int]
    only_in_b: list[int]
    caption_mismatch: list[int]


def compare_rewards(a: dict[int, dict], b: dict[int, dict], floor: float = 1e-8) -> RewardDiff:
    common = sorted(set(a) & set(b))
    mismatch = [i for i in common if a[i].get("caption") != b[i].get("caption")]
    if not common:
        nan = math.nan
        return RewardDiff(0, nan, nan, nan, nan, None, {}, sorted(set(a) - set(b)), sorted(set(b) - set(a)), [])
    ra = np.array([a[i]["reward"] for i in common])
    rb = np.array([b[i]["reward"] for i in common])
    rel = relative_errors(ra, rb, floor)
    per = {}
    names = set(a[common[0]].get("rewards", {})) & set(b[common[0]].get("rewards", {}))
    for name in sorted(names):
        e = relative_errors([a[i]["rewards"][name] for i in common], [b[i]["rewards"][name] for i in common], floor)
        per[name] = {"mean_rel": float(e.mean()), "max_rel": float(e.max())}
    return RewardDiff(
        n=len(common), mean_a=float(ra.mean()), mean_b=float(rb.mean()), mean_rel=float(rel.mean()),
        max_rel=float(rel.max()), worst_sample=common[int(np.argmax(rel))], per_reward=per,
        only_in_a=sorted(set(a) - set(b)), only_in_b=sorted(set(b) - set(a)), caption_mismatch=mismatch,
    )


@dataclass
class ImageDiff:
    name: str
    psnr: float
    max_abs_diff: int


def compare_images(a: dict[str, Path], b: dict[str, Path]) -> tuple[list[ImageDiff], list[str]]:
    """PSNR and max pixel difference of every image name in both; plus names in only one."""
    out = []
    for name in sorted(set(a) & set(b)):
        pa, pb = _read_png(a[name]), _read_png(b[name])
        if pa.shape != pb.shape:
            out.append(ImageDiff(name, -math.inf, 255))
            continue
        diff = int(np.abs(pa.astype(np.int16) - pb.astype(np.int16)).max())
        out.append(ImageDiff(name, psnr(pa, pb), diff))
    return out, sorted(set(a) ^ set(b))


def compare_tensor_files(a: list[Path], b: list[Path]) -> dict:
    """Relative errors of the recorded tensors present in both runs:
    {initial_noise_max_rel, latents_final_max_rel, latents_step_rel {id: [per step]}, n_noise}."""
    from safetensors.torch import load_file

    def load(files):
        out = {}
        for f in files:
            out.update(load_file(str(f)))
        return out

    ta, tb = load(a), load(b)
    common = sorted(set(ta) & set(tb))
    noise, steps, final = [], {}, []
    for key in common:
        x, y = ta[key].double(), tb[key].double()
        if x.shape != y.shape:
            continue
        if key.startswith("initial_noise/"):
            noise.append(float((x - y).norm() / x.norm().clamp_min(1e-30)))
        elif key.startswith("latents/"):
            per_step = ((x - y).flatten(1).norm(dim=1) / x.flatten(1).norm(dim=1).clamp_min(1e-30)).tolist()
            steps[key.split("/", 1)[1]] = per_step
            final.append(per_step[-1])
    return {
        "n_noise": len(noise),
        "initial_noise_max_rel": max(noise) if noise else None,
        "latents_final_max_rel": max(final) if final else None,
        "latents_step_rel": steps,
    }


@dataclass
class IterationComparison:
    iteration: int
    reward: RewardDiff
    images: list[ImageDiff]
    unmatched_images: list[str]
    loss_a: float | None
    loss_b: float | None
    tensors: dict | None

    @property
    def min_psnr(self) -> float | None:
        return min((d.psnr for d in self.images), default=None)

    @property
    def max_pixel_diff(self) -> int | None:
        return max((d.max_abs_diff for d in self.images), default=None)


def _loss(metrics: dict | None) -> float | None:
    if not metrics or "loss" not in metrics or metrics["loss"] is None:
        return None
    return float(metrics["loss"])


def compare_iteration(a: IterationRecord, b: IterationRecord, floor: float) -> IterationComparison:
    images, unmatched = compare_images(a.images, b.images)
    tensors = compare_tensor_files(a.tensor_files, b.tensor_files) if a.tensor_files and b.tensor_files else None
    return IterationComparison(a.iteration, compare_rewards(a.samples, b.samples, floor), images, unmatched,
                               _loss(a.metrics), _loss(b.metrics), tensors)


# ---------------------------------------------------------------------------------- probes


@dataclass
class ProbeDiff:
    key: str
    module: str
    kind: str
    rel_err: float
    tol: float
    status: str  # ok | over | shape | missing | nonfinite

    @property
    def failed(self) -> bool:
        return self.status != "ok"


@dataclass
class ProbeComparison:
    entries: list[ProbeDiff]  # in A's execution order
    meta_a: dict
    meta_b: dict
    notes: list[str]

    @property
    def first_failure(self) -> ProbeDiff | None:
        return next((e for e in self.entries if e.failed), None)


def compare_probe_recordings(a, b, tol: dict[str, float]) -> ProbeComparison:
    """Walk A's entries in execution order; relative error ||a - b|| / ||a|| of each output."""
    import torch

    notes = []
    for k in ("transformer_dtype", "vae_dtype", "autocast_dtype"):
        if a.meta.get(k) != b.meta.get(k):
            notes.append(f"probe {k} differs: {a.meta.get(k)} (A) vs {b.meta.get(k)} (B); expect larger errors")
    if a.meta.get("input") != b.meta.get("input"):
        notes.append(f"probe inputs differ: {a.meta.get('input')} vs {b.meta.get('input')}; the comparison is void")
    out = []
    for e in a.entries:
        t = tol.get(e.kind, max(tol.values()))
        y = b.tensors.get(e.key)
        if y is None:
            out.append(ProbeDiff(e.key, e.module, e.kind, math.nan, t, "missing"))
            continue
        x = a.tensors[e.key]
        if tuple(x.shape) != tuple(y.shape):
            out.append(ProbeDiff(e.key, e.module, e.kind, math.nan, t, "shape"))
            continue
        x, y = x.double(), y.double()
        rel = float((x - y).norm() / x.norm().clamp_min(1e-30))
        if not (torch.isfinite(x).all() and torch.isfinite(y).all()) or not math.isfinite(rel):
            status = "nonfinite"
        else:
            status = "over" if rel > t else "ok"
        out.append(ProbeDiff(e.key, e.module, e.kind, rel, t, status))
    extra = [e.key for e in b.entries if e.key not in a.tensors]
    if extra:
        notes.append(f"{len(extra)} probe outputs only in B (first: {extra[0]})")
    return ProbeComparison(out, a.meta, b.meta, notes)


# ---------------------------------------------------------------------------------- the verdict


@dataclass
class Check:
    name: str
    passed: bool | None  # None: not evaluated (no data or no threshold)
    detail: str
    first_failing_iteration: int | None = None


@dataclass
class LossTrend:
    iterations: list[int]
    loss_a: list[float]
    loss_b: list[float]
    corr: float  # Pearson of the loss series
    diff_corr: float  # Pearson of their first differences


@dataclass
class Comparison:
    run_a: RunRecord
    run_b: RunRecord
    thresholds: Thresholds
    iterations: list[IterationComparison]
    loss: LossTrend
    probes: ProbeComparison | None
    checks: list[Check]
    warnings: list[str]
    config_diff: dict[str, tuple]

    @property
    def passed(self) -> bool:
        evaluated = [c for c in self.checks if c.passed is not None]
        return bool(evaluated) and all(c.passed for c in evaluated)


def _reward_check(its: list[IterationComparison], th: Thresholds) -> Check:
    if not its:
        return Check("reward", None, "no iteration recorded in both runs")
    for c in its:
        r = c.reward
        if r.n == 0:
            return Check("reward", False, f"iteration {c.iteration}: no sample id in both runs; the runs sampled "
                         "different prompts (use the same --seed/--sampler_seed, or --load_randomness)", c.iteration)
        if r.caption_mismatch:
            return Check("reward", False, f"iteration {c.iteration}: sample(s) {r.caption_mismatch[:5]} have different "
                         "captions in the two runs; the prompt order differs (same --sampler_seed, same data)",
                         c.iteration)
        if not math.isfinite(r.mean_rel) or r.mean_rel > th.reward_tol:
            return Check("reward", False, f"iteration {c.iteration}: mean reward relative error {r.mean_rel:.4g} > "
                         f"{th.reward_tol:g} (max {r.max_rel:.4g}, worst sample {r.worst_sample})", c.iteration)
    worst = max(its, key=lambda c: c.reward.mean_rel)
    return Check("reward", True, f"mean reward relative error <= {th.reward_tol:g} in all {len(its)} iterations "
                 f"(worst {worst.reward.mean_rel:.4g} at iteration {worst.iteration})")


def _image_check(its: list[IterationComparison], th: Thresholds) -> Check:
    with_images = [c for c in its if c.images]
    if th.psnr_min is None:
        return Check("images", None, "no --psnr_min given (PSNR reported, not judged)")
    if not with_images:
        return Check("images", None, "no image recorded in both runs")
    for c in with_images:
        if c.min_psnr < th.psnr_min:
            worst = min(c.images, key=lambda d: d.psnr)
            return Check("images", False, f"iteration {c.iteration}: {worst.name} PSNR {worst.psnr:.2f} dB < "
                         f"{th.psnr_min:g} dB (max pixel difference {worst.max_abs_diff})", c.iteration)
    worst = min(with_images, key=lambda c: c.min_psnr)
    if math.isinf(worst.min_psnr):
        return Check("images", True, "every image is identical in both runs")
    return Check("images", True, f"every image PSNR >= {th.psnr_min:g} dB (worst {worst.min_psnr:.2f} dB at "
                 f"iteration {worst.iteration})")


def _loss_check(loss: LossTrend, th: Thresholds) -> Check:
    if th.loss_corr_min is None:
        return Check("loss_trend", None, "no --loss_corr_min given (trend reported, not judged)")
    if len(loss.iterations) < 3 or not math.isfinite(loss.corr):
        return Check("loss_trend", None, f"too few iterations with a varying loss ({len(loss.iterations)}) to "
                     "judge the trend")
    ok = loss.corr >= th.loss_corr_min
    return Check("loss_trend", ok, f"Pearson r of the loss series {loss.corr:.3f} {'>=' if ok else '<'} "
                 f"{th.loss_corr_min:g}")


def _probe_check(p: ProbeComparison | None) -> Check:
    if p is None:
        return Check("layers", None, "no probes in both runs (--probe_layers)")
    f = p.first_failure
    if f is None:
        return Check("layers", True, f"all {len(p.entries)} probed outputs within tolerance")
    what = {"over": f"relative error {f.rel_err:.3g} > {f.tol:g}", "shape": "output shapes differ",
            "missing": "output missing in B", "nonfinite": "non-finite values"}[f.status]
    return Check("layers", False, f"first diverging module: {f.key} ({f.kind}): {what}")


_IGNORED_CONFIG = ("output.output_dir", "output.image_dir", "output.record_dir", "output.dump_randomness",
                   "output.load_randomness", "output.resume_from_checkpoint", "data_json_path",
                   "model.pretrained_model_name_or_path", "model.vae_model_path", "model.dit_model_name_or_path")


def config_differences(ma: dict | None, mb: dict | None) -> dict[str, tuple]:
    """Config keys (dotted) whose values differ, paths excluded; empty without both manifests."""
    if not ma or not mb:
        return {}
    fa, fb = flatten_dict(ma.get("config", {}), "."), flatten_dict(mb.get("config", {}), ".")
    return {k: (fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb))
            if fa.get(k) != fb.get(k) and k not in _IGNORED_CONFIG and not k.startswith("compat_notes")}


def compare_runs(path_a: str | Path, path_b: str | Path, thresholds: Thresholds | None = None) -> Comparison:
    """Load both runs and compute every comparison and check. Raises RunFolderError."""
    th = thresholds or Thresholds()
    a, b = load_run(path_a), load_run(path_b)
    warnings = a.warnings + b.warnings
    limit = th.max_iterations
    ia = {i for i in a.iterations if i <= limit}
    ib = {i for i in b.iterations if i <= limit}
    if ia - ib:
        warnings.append(f"{len(ia - ib)} iteration(s) only in A (first {min(ia - ib)}); compared the common ones")
    if ib - ia:
        warnings.append(f"{len(ib - ia)} iteration(s) only in B (first {min(ib - ia)}); compared the common ones")
    its = [compare_iteration(a.iterations[i], b.iterations[i], th.reward_floor) for i in sorted(ia & ib)]
    for c in its:
        if c.reward.only_in_a or c.reward.only_in_b:
            warnings.append(f"iteration {c.iteration}: {len(c.reward.only_in_a)} sample(s) only in A, "
                            f"{len(c.reward.only_in_b)} only in B")
        if c.unmatched_images:
            warnings.append(f"iteration {c.iteration}: {len(c.unmatched_images)} image(s) in only one run")
        t = c.tensors
        if t and t["initial_noise_max_rel"] is not None and t["initial_noise_max_rel"] > NOISE_MATCH_TOL:
            warnings.append(f"iteration {c.iteration}: the initial noise differs (relative error "
                            f"{t['initial_noise_max_rel']:.3g}): randomness is not fixed; use the same --seed "
                            "or --dump_randomness on A and --load_randomness on B")
    paired = [(c.iteration, c.loss_a, c.loss_b) for c in its if c.loss_a is not None and c.loss_b is not None]
    la, lb = [p[1] for p in paired], [p[2] for p in paired]
    loss = LossTrend([p[0] for p in paired], la, lb, pearson(la, lb), pearson(np.diff(la), np.diff(lb)))
    probe_cmp = None
    if a.probe_dir is not None and b.probe_dir is not None:
        probe_cmp = compare_probe_recordings(probes_mod.load_probes(a.probe_dir), probes_mod.load_probes(b.probe_dir),
                                             th.layer_tol)
        warnings.extend(probe_cmp.notes)
    elif (a.probe_dir is None) != (b.probe_dir is None):
        warnings.append("only one run holds probes; record both with the same --probe_layers")
    checks = [_reward_check(its, th), _image_check(its, th), _loss_check(loss, th), _probe_check(probe_cmp)]
    diff = config_differences(a.manifest, b.manifest)
    note = precision_note(diff) if probe_cmp is not None else None
    warnings += [note] if note else []
    return Comparison(a, b, th, its, loss, probe_cmp, checks, warnings, diff)


_PRECISION_KEYS = ("model.mixed_precision", "fsdp_param_dtype")


def precision_note(diff: dict[str, tuple]) -> str | None:
    """A warning when the runs differ in precision: the layer probes run in the weights' own dtype,
    without autocast, so an fp32 and a bf16 run agree there (error 0) whatever their training did."""
    keys = [k for k in _PRECISION_KEYS if k in diff]
    if not keys:
        return None
    what = ", ".join(f"{k} {diff[k][0]} vs {diff[k][1]}" for k in keys)
    return (f"the runs differ in precision ({what}): the layer probes run without autocast, in the weights' "
            "own dtype, so their verdict does not cover that difference; judge it by the rewards, images and loss")
