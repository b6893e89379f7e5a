"""Evaluation inside a training run: a trainer hook (start: the base model; after each
iteration when due), with the reward-hacking guard.

Files under OUTPUT_DIR: eval.jsonl (one record per evaluation), eval/rows/row_NNNNNN.png,
eval_grid.png (one row per evaluation), eval_curve.png, and best/ (see training/run/guard.py).
"""

from __future__ import annotations

import contextlib

from pathlib import Path

from fastvideo import devices
from fastvideo.errors import ConfigError
from fastvideo.eval import report
from fastvideo.eval.core import EvalResult, SampleSettings, evaluate
from fastvideo.eval.prompts import check_no_overlap, load_eval_prompts
from fastvideo.eval.settings import EvalSettings
from fastvideo.training.run.guard import RewardHackingGuard, publish_best, recover_best, standard_error
from fastvideo.training.hooks import TrainerHook
from fastvideo.utils import main_print, read_json_or_none

EVAL_JSONL = "eval.jsonl"


def build_eval_rewards(names, trainer) -> dict:
    """name -> reward; the trained rewards' objects are reused, the others built like them."""
    from fastvideo.rewards.registry import build_reward
    from fastvideo.training import builders

    existing = {name: r for name, _, r in trainer.reward.components}
    per_reward, common = builders.reward_build_kwargs(trainer.cfg, trainer.device, trainer.family)
    return {n: existing.get(n) or build_reward(n, **{**common, **per_reward.get(n, {})}) for n in names}


class TrainingEvaluation(TrainerHook):
    def __init__(self, settings: EvalSettings, trainer):
        cfg = trainer.cfg
        self.s = settings
        self.out = Path(cfg.output.output_dir)
        seq_len = settings.max_sequence_length or trainer.dataset.dims()[0]
        self.family = trainer.family
        self.prompts = load_eval_prompts(settings.prompts, cfg.model.pretrained_model_name_or_path, seq_len,
                                         trainer.device, family=self.family)
        check_no_overlap(self.prompts.captions, trainer.dataset.captions)
        if tuple(self.prompts.dims) != tuple(trainer.dataset.dims()):
            raise ConfigError(f"--eval_prompts embeddings have dims {tuple(self.prompts.dims)} but the training "
                             f"embeddings have {tuple(trainer.dataset.dims())}; use the same encoders")
        self.rewards = build_eval_rewards(settings.rewards, trainer)
        r = cfg.rollout
        self.sample = SampleSettings(
            height=r.height, width=r.width, steps=settings.steps, eta=settings.eta, shift=r.shift,
            batch_size=settings.batch_size, num_images_per_prompt=settings.num_images_per_prompt,
            sigma_grid=r.sigma_grid, terminal=trainer.family.schedule_terminal())
        g = settings.guard
        self.guard = RewardHackingGuard(g.patience if g else 1, g.drop if g else None, guard_enabled=g is not None)
        self.is_main = trainer.info.is_main
        self._saved_at: int | None = None  # iteration of a checkpoint written outside the schedule
        main_print(f"[eval] {len(self.prompts)} held-out prompts x {settings.num_images_per_prompt} images, "
                   f"rewards {', '.join(settings.rewards)}, every {settings.every} iterations")

    # ------------------------------------------------------------------ trainer hooks
    def on_train_start(self, trainer) -> None:
        self.start(trainer)

    def on_step_end(self, trainer) -> bool:
        return self.after_iteration(trainer)

    def start(self, trainer) -> None:
        """Before the first iteration: evaluate the base model, or on resume rebuild the guard (and
        run the resumed iteration's evaluation if it was due but not recorded: a crash between
        its checkpoint and its eval.jsonl line)."""
        path = self.out / EVAL_JSONL
        if self.is_main:
            recover_best(self.out)
        if trainer.iteration == 0:
            if self.is_main and path.exists():
                path.unlink()
            self.run(trainer)
            return
        from fastvideo.errors import UserError
        from fastvideo.training.run.start import fail_together

        records, failure = [], None
        try:  # rank 0's file: a damaged one stops every rank, not rank 0 alone
            records = report.truncate_jsonl(path, trainer.iteration) if self.is_main else []
        except UserError as exc:
            failure = exc
        fail_together(failure, trainer.dims.world_size, trainer.device, "rank 0 refused eval.jsonl")
        for rec in records:
            self.guard.update(rec["iteration"], rec["trained_score"], rec.get("guard_score"), rec.get("guard_se", 0.0))
        missing = self.is_main and trainer.iteration % self.s.every == 0 and not any(
            r["iteration"] == trainer.iteration for r in records)
        self._share_guard_state(trainer)
        if self.is_main:
            self._forget_other_best(trainer.iteration)
        if self._any_rank(trainer, missing):
            main_print(f"[eval] evaluation {trainer.iteration} was due but not recorded in {path} "
                       "(a crash after its checkpoint): running it now")
            self.run(trainer)

    @staticmethod
    def _any_rank(trainer, flag: bool) -> bool:
        """Rank 0's decision, on every rank (only rank 0 may see OUTPUT_DIR)."""
        if trainer.dims.world_size == 1:
            return flag
        import torch

        return bool(trainer.dims.all_reduce_max(torch.tensor([float(flag)], device=trainer.device)).item() > 0)

    def _forget_other_best(self, iteration: int) -> None:
        """best/ must be the best of the records kept, intact: one from after the resumed iteration
        (an abandoned continuation), from an evaluation never recorded (a crash), with a torn
        BEST.json, or whose files no longer match their checksums (a bit flip) is published again
        from the records' best checkpoint, or removed if that one is gone or damaged too."""
        import shutil

        from fastvideo.training.checkpoint import checkpoint_dir
        from fastvideo.training.run.guard import BEST_DIR, BEST_MARKER

        if not (self.out / BEST_DIR).exists():
            return
        marker = read_json_or_none(self.out / BEST_DIR / BEST_MARKER)
        best = self.guard.best_iteration
        damage = _damage(self.out / BEST_DIR)
        if marker is not None and marker.get("iteration") == best and damage is None:
            return
        source = checkpoint_dir(self.out, best) if best is not None else None
        if source is not None and source.is_dir() and _damage(source) is None:
            publish_best(source, self.out, best, self.guard.best_score)
            if damage is not None:
                main_print(f"[eval] {self.out / BEST_DIR} was damaged ({damage}): published again from {source}")
        else:
            shutil.rmtree(self.out / BEST_DIR)
            why = f"it is damaged ({damage})" if damage else "it is not the best of the evaluations recorded"
            main_print(f"[eval] removed {self.out / BEST_DIR}: {why} up to the resumed iteration {iteration}, and "
                       f"no intact checkpoint of the best iteration is left to publish again")

    def after_iteration(self, trainer) -> bool:
        """Evaluate when due; True when the guard stops the run (a checkpoint has been written)."""
        if trainer.iteration % self.s.every:
            return False
        return self.run(trainer)

    # ------------------------------------------------------------------ one evaluation
    def run(self, trainer) -> bool:
        trainer.model.eval()
        gathered = getattr(trainer, "nograd_weights", contextlib.nullcontext)  # --rollout_weights gathered
        with gathered():
            result = evaluate(trainer.model, trainer.vae, self.prompts, self.rewards, trainer.randomness, self.sample,
                              trainer.device, trainer.autocast_dtype, self.s.grid_prompts, progress=True,
                              family=self.family, dims=trainer.dims)
        it = trainer.iteration
        trained = sum(w * result.scores[n].mean().item() for n, w in self.s.trained)
        guard_name = self.s.guard.reward if self.s.guard else None
        guard_score = result.scores[guard_name].mean().item() if guard_name else None
        guard_se = standard_error(result.scores[guard_name]) if guard_name else 0.0
        decision = self.guard.update(it, trained, guard_score, guard_se)
        record = {"iteration": it, "time_eval": result.seconds, "trained_score": trained,
                  "rewards": result.summary(), "best_iteration": self.guard.best_iteration}
        if guard_name:
            record.update(guard_score=guard_score, guard_se=guard_se, guard=decision.as_dict())
        if decision.new_best:
            self._publish_best(trainer, it, trained)
        self._write(trainer, record, result)
        main_print(f"[eval] iteration {it}: trained score {trained:.4g}"
                   + "".join(f", {n} {v['mean']:.4g}" for n, v in record["rewards"].items())
                   + f" ({result.seconds:.1f} s, not counted in training time)")
        if decision.fired:
            main_print(self.guard.message(it, trained, guard_name, guard_score, self.out))
            if self.s.guard.action == "stop":
                self._ensure_checkpoint(trainer)
                main_print(f"[guard] stopping the run at iteration {it} (--guard_action stop); "
                           f"checkpoint written, best checkpoint: iteration {self.guard.best_iteration}")
                return True
        return False

    def _write(self, trainer, record: dict, result: EvalResult) -> None:
        flat = {f"eval/{n}_mean": v["mean"] for n, v in record["rewards"].items()}
        flat.update({f"eval/{n}_std": v["std"] for n, v in record["rewards"].items()})
        trainer.log_metrics({**flat, "eval/trained_score": record["trained_score"],
                             "eval/time": record["time_eval"]}, step=record["iteration"])
        if not self.is_main:
            return
        report.append_jsonl(self.out / EVAL_JSONL, record)
        report.save_row(result.grid, report.row_path(self.out / "eval", record["iteration"]),
                        getattr(trainer.family, "video_fps", None))
        records = report.read_jsonl(self.out / EVAL_JSONL)
        rows = [(f"it {r['iteration']}", report.row_path(self.out / "eval", r["iteration"])) for r in records]
        sources = trainer.family.source_images(self.prompts.cond)  # editing: the (first reference's) source row on top
        if sources is not None:
            cells = report.source_cells(sources[:self.s.grid_prompts], result.grid)
            rows.insert(0, ("source", report.save_row(cells, self.out / "eval" / "source.png")))
        report.compose_grid([r for r in rows if r[1].exists()], self.out / "eval_grid.png",
                            result.captions[:self.s.grid_prompts])
        report.plot_eval_curve(records, self.out / "eval_curve.png", self.s.guard.reward if self.s.guard else None)

    def _ensure_checkpoint(self, trainer) -> Path:
        """The checkpoint of the current iteration, written now if the schedule did not (collective).

        Decided from the schedule, not from the file system, so every rank makes the same choice
        even where only rank 0 sees OUTPUT_DIR."""
        from fastvideo.training.checkpoint import checkpoint_dir

        it, o = trainer.iteration, trainer.cfg
        scheduled = it % o.output.checkpointing_steps == 0 or it == o.optim.max_train_steps
        if not scheduled and self._saved_at != it:
            trainer.save_checkpoint()
            self._saved_at = it
        return checkpoint_dir(self.out, it)

    def _publish_best(self, trainer, iteration: int, score: float) -> None:
        path = self._ensure_checkpoint(trainer)
        if self.is_main:
            publish_best(path, self.out, iteration, score)
            main_print(f"[eval] best checkpoint is now iteration {iteration} -> {self.out / 'best'}")
        devices.barrier()

    def _share_guard_state(self, trainer) -> None:
        """On resume rank 0 read eval.jsonl; every rank needs the same guard state."""
        if trainer.dims.world_size == 1:
            return
        import torch.distributed as dist

        box = [self.guard.__dict__ if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        self.guard.__dict__.update(box[0])


def _damage(folder) -> str | None:
    """Why ``folder`` (a checkpoint, or best/) is not intact: its marker missing, a file of the wrong
    size or whose sha256 does not match (one line); None when intact."""
    from fastvideo.errors import UserError, one_line
    from fastvideo.training.checkpoint.files import verify_checkpoint

    try:
        verify_checkpoint(folder)
    except UserError as exc:
        return one_line(exc)
    return None
