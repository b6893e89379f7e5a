"""Flags -> typed, validated configuration for GRPO training.

Every flag of upstream DanceGRPO's FLUX trainer and of the Ascend recipe's scripts is accepted so
existing launch lines work unchanged. Each flag either works, or fails with a message saying why
(for example ``--sp_size 2``), or is listed in COMPAT_ONLY_FLAGS: accepted, logged as having no
effect, and documented in README.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

from fastvideo.errors import UserError
from fastvideo.grpo.loss import candidate_steps, num_trained_steps
from fastvideo.training.lora import LoraSettings, add_lora_args, lora_settings
from fastvideo.sampling import mix as sampling_mix

# Flags accepted only so that upstream launch lines keep working; they change nothing here.
COMPAT_ONLY_FLAGS = {
    "cache_dir": "no model hub is used: every model is loaded from a local folder",
    "train_sp_batch_size": "sequence parallelism is not supported (sp_size must be 1)",
    "logging_dir": "metrics go to OUTPUT_DIR/metrics.jsonl; wandb writes under OUTPUT_DIR/wandb",
}


from fastvideo.errors import ConfigError  # noqa: E402,F401  (re-exported)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train_grpo_flux",
        description="GRPO fine-tuning of FLUX (DanceGRPO-compatible flags).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("data")
    g.add_argument("--data_json_path", type=str, required=True,
                   help="videos2caption.json written by preprocess_flux_embedding")
    g.add_argument("--dataloader_num_workers", type=int, default=4,
                   help="threads that load prompt embeddings in parallel (0: in the main thread)")
    g.add_argument("--train_batch_size", type=int, default=1, help="prompts per rank per iteration")
    g.add_argument("--num_latent_t", type=int, default=1, help="latent frames; must be 1 for images")
    g.add_argument("--sampler_seed", type=int, default=None, help="seed of the prompt order (default: --seed)")

    g = p.add_argument_group("models")
    g.add_argument("--pretrained_model_name_or_path", type=str, required=True,
                   help="diffusers-layout FLUX folder (data/flux)")
    g.add_argument("--dit_model_name_or_path", type=str, default=None,
                   help="take the transformer from this folder instead (a FLUX folder or a transformer folder)")
    g.add_argument("--vae_model_path", type=str, default=None, help="FLUX folder to take the VAE from")
    g.add_argument("--vae_precision", type=str, default="auto", choices=["auto", "fp32", "bf16"],
                   help="VAE weights' dtype for decoding rollouts; auto: bf16 on GPU/NPU, fp32 on CPU")
    g.add_argument("--cache_dir", type=str, default=None, help="compatibility only")

    g = p.add_argument_group("rewards")
    g.add_argument("--rewards", type=str, default=None,
                   help='weighted rewards, e.g. "hpsv2:1.0,pickscore:0.5" (names: hpsv2, pickscore, clip, '
                        'compressibility, aesthetic, imagereward, detail, saturation; remote:URL/NAME:W; '
                        'vlm:URL?model=M:W)')
    g.add_argument("--use_hpsv2", action="store_true", help="alias of --rewards hpsv2:1.0")
    g.add_argument("--use_pickscore", action="store_true", help="alias of --rewards pickscore:1.0")
    g.add_argument("--reward_group_norm", action="store_true",
                   help="normalise each reward within its group before weighting")
    g.add_argument("--hps_ckpt_dir", type=str, default="./hps_ckpt")
    g.add_argument("--hps_model_name", type=str, default="ViT-H-14",
                   help="open_clip architecture of the HPS checkpoint")
    g.add_argument("--pickscore_dir", type=str, default="./pickscore_ckpt")
    g.add_argument("--pickscore_processor_dir", type=str, default=None)
    g.add_argument("--clip_dir", type=str, default="./clip_ckpt")
    g.add_argument("--reward_device", type=str, default="train", choices=["train", "cpu"],
                   help="score on the training device or on the CPU")
    g.add_argument("--reward_batch_size", type=int, default=8)
    g.add_argument("--reward_precision", type=str, default="auto", choices=["auto", "fp16", "bf16", "fp32"],
                   help="autocast dtype of model rewards (HPS, PickScore, CLIP); auto: fp16 on GPU/NPU as upstream "
                        "DanceGRPO and the Ascend recipe score, fp32 on CPU")
    g.add_argument("--reward_overlap", type=str, default="auto", choices=["auto", "on", "off"],
                   help="score each rollout chunk on a worker thread while the next chunk samples; auto: on "
                        "only when the reward runs on another device than the rollout (--reward_device cpu "
                        "with a GPU/NPU), where the two do not compete (docs/performance.md)")
    from fastvideo.rewards.flags import add_reward_flags

    add_reward_flags(p)

    g = p.add_argument_group("GRPO")
    g.add_argument("--h", type=int, default=720, help="image height (multiple of 16)")
    g.add_argument("--w", type=int, default=720, help="image width (multiple of 16)")
    g.add_argument("--t", type=int, default=1, help="frames; must be 1 for images")
    g.add_argument("--sampling_steps", type=int, default=16)
    g.add_argument("--eta", type=float, default=0.3)
    g.add_argument("--shift", type=float, default=3.0)
    g.add_argument("--guidance_scale", type=float, default=3.5, help="FLUX.1-dev guidance embedding value")
    g.add_argument("--no_quantize_timestep", action="store_true",
                   help="pass the exact sigma to the transformer (diffusers' FluxPipeline) instead of "
                        "upstream's floor(1000*sigma)/1000")
    g.add_argument("--num_generations", type=int, default=12, help="samples per prompt (group size)")
    g.add_argument("--use_group", action="store_true",
                   help="expand each prompt into --num_generations samples and normalise advantages within "
                        "each group; without it (upstream) every prompt gets one sample and advantages are "
                        "normalised over the gathered batch")
    g.add_argument("--adv_std", type=str, default="sample", choices=["sample", "population"],
                   help="std used to normalise advantages: sample (torch.std, upstream DanceGRPO) or "
                        "population (Flow-GRPO)")
    g.add_argument("--train_last_step", action="store_true",
                   help="also train the last sampling transition (upstream never trains it)")
    g.add_argument("--ignore_last", action="store_true",
                   help="do not train the last transition: the default; accepted for upstream launch lines")
    g.add_argument("--init_same_noise", action="store_true", help="share the initial noise within a group")
    g.add_argument("--no_share_ode_prefix", action="store_true",
                   help="with --init_same_noise, still compute a window plan's leading ODE steps for every sample "
                        "(by default once per group: the G samples pass through the same states there)")
    g.add_argument("--timestep_fraction", type=float, default=0.6)
    g.add_argument("--clip_range", type=float, default=1e-4)
    g.add_argument("--adv_clip_max", type=float, default=5.0)
    g.add_argument("--loss_coef", type=float, default=1.0, help="multiplies the loss")
    g.add_argument("--kl_coef", type=float, default=0.0,
                   help="beta of a KL penalty to the frozen base policy (closed-form KL of each trained SDE "
                        "step; LoRA: the adapters switched off; full fine-tuning: a frozen copy of the initial "
                        "weights, sharded like the model). 0: off")
    g.add_argument("--rollout_batch_size", type=int, default=1, help="samples per transformer call in the rollout")
    g.add_argument("--train_micro_batch_size", type=int, default=1, help="samples per micro-batch in the update")
    g.add_argument("--cfg", type=float, default=0.0, help="classifier-free guidance; must be 0 (FLUX.1-dev is guidance-distilled)")
    g.add_argument("--precondition_outputs", action="store_true", help="not supported for FLUX")

    sampling_mix.add_arguments(p)
    from fastvideo import mixgrpo_compat

    mixgrpo_compat.add_arguments(p)

    g = p.add_argument_group("optimisation")
    g.add_argument("--seed", type=int, default=42)
    g.add_argument("--max_train_steps", type=int, default=300, help="GRPO iterations")
    g.add_argument("--gradient_accumulation_steps", type=int, default=1, help="micro-batches per optimizer step")
    g.add_argument("--learning_rate", type=float, default=1e-5)
    g.add_argument("--weight_decay", type=float, default=1e-4)
    g.add_argument("--max_grad_norm", type=float, default=1.0)
    g.add_argument("--lr_scheduler", type=str, default="constant_with_warmup")
    g.add_argument("--lr_warmup_steps", type=int, default=0)
    g.add_argument("--lr_num_cycles", type=int, default=1)
    g.add_argument("--lr_power", type=float, default=1.0)
    g.add_argument("--mixed_precision", type=str, default="bf16", choices=["no", "fp16", "bf16"])
    g.add_argument("--master_weight_type", type=str, default="fp32", choices=["fp32", "bf16"])
    g.add_argument("--allow_tf32", action="store_true", help="TF32 matmuls on CUDA, HF32 on NPU")
    g.add_argument("--gradient_checkpointing", action="store_true")
    g.add_argument("--selective_checkpointing", type=float, default=1.0,
                   help="fraction of transformer blocks to checkpoint (from the first)")
    g.add_argument("--use_ema", action="store_true")
    g.add_argument("--ema_decay", type=float, default=0.995)
    g.add_argument("--ema_start_step", type=int, default=0)
    g.add_argument("--max_nonfinite_steps", type=int, default=3,
                   help="abort after this many optimizer steps in a row with a non-finite loss or gradient")

    g = p.add_argument_group("parallelism")
    g.add_argument("--fsdp_sharding_startegy", "--fsdp_sharding_strategy", dest="fsdp_sharding_strategy",
                   type=str, default="full", choices=["full", "hybrid", "none"])
    g.add_argument("--use_cpu_offload", action="store_true")
    g.add_argument("--sp_size", type=int, default=1, help="sequence parallel size; must be 1")
    g.add_argument("--train_sp_batch_size", type=int, default=1, help="compatibility only")

    g = p.add_argument_group("outputs")
    g.add_argument("--output_dir", type=str, default="data/outputs/grpo")
    g.add_argument("--logging_dir", type=str, default="logs", help="compatibility only")
    g.add_argument("--checkpointing_steps", type=int, default=40)
    g.add_argument("--checkpoints_total_limit", type=int, default=3, help="keep the last K checkpoints")
    g.add_argument("--resume_from_checkpoint", type=str, default=None, help='"latest" or a checkpoint folder')
    g.add_argument("--image_dir", type=str, default=None,
                   help="folder under which images/step_NNNNNN/ is written (default OUTPUT_DIR)")
    g.add_argument("--save_images_every", type=int, default=1, help="save rollout images every N iterations (0: never)")
    g.add_argument("--report_to", type=str, default="none", choices=["none", "wandb"])

    g = p.add_argument_group("alignment")
    g.add_argument("--record_dir", type=str, default=None, help="record a run for compare_runs")
    g.add_argument("--record_tensors", action="store_true", help="also record initial noise and sample-0 latents")
    g.add_argument("--dump_randomness", type=str, default=None, help="capture every random draw to DIR")
    g.add_argument("--load_randomness", type=str, default=None, help="replay random draws from DIR")
    g.add_argument("--resume_allow_changes", action="store_true",
                   help="resume even if the run-defining settings (seed, group size, schedule, rewards, "
                        "batch layout ...) differ from the checkpoint's; the differences are logged")
    g.add_argument("--probe_layers", type=str, default=None,
                   help='record module outputs for one fixed input: "all" or comma-separated kinds '
                        "(rope,norm,attention,block,vae)")
    from fastvideo.eval.settings import add_eval_args

    add_eval_args(p)  # --eval_* and --guard_* (fastvideo/eval/settings.py)
    add_lora_args(p)
    return p


@dataclass
class ModelConfig:
    pretrained_model_name_or_path: str
    dit_model_name_or_path: str | None
    vae_model_path: str
    vae_precision: str
    master_weight_type: str
    mixed_precision: str
    allow_tf32: bool
    gradient_checkpointing: bool
    selective_checkpointing: float


@dataclass
class RolloutSettings:
    height: int
    width: int
    sampling_steps: int
    eta: float
    shift: float
    guidance_scale: float
    quantize_timestep: bool
    num_generations: int
    rollout_batch_size: int
    init_same_noise: bool
    share_ode_prefix: bool = True


@dataclass
class RewardSettings:
    spec: list  # [RewardSpec(name, weight)]
    group_norm: bool
    hps_ckpt_dir: str
    hps_model_name: str
    pickscore_dir: str
    pickscore_processor_dir: str | None
    clip_dir: str
    device: str
    batch_size: int
    overlap: str  # auto | on | off (see builders.overlap_reward_scoring)
    precision: str  # auto | fp16 | bf16 | fp32 (see builders.reward_dtype)
    extras: object = None  # rewards.flags.RewardExtras: newer rewards' paths, remote settings


@dataclass
class GRPOSettings:
    use_group: bool
    adv_std: str  # sample | population
    train_last_step: bool
    timestep_fraction: float
    clip_range: float
    adv_clip_max: float
    loss_coef: float
    train_micro_batch_size: int
    gradient_accumulation_steps: int
    kl_coef: float = 0.0

    def candidate_steps(self, sampling_steps: int) -> int:
        """Transitions a sample may train on: 0 .. N-2 upstream (the last one never), N with --train_last_step."""
        return candidate_steps(sampling_steps, self.train_last_step)

    def trained_steps(self, sampling_steps: int) -> int:
        """T: how many of the candidate transitions each sample trains on."""
        return num_trained_steps(sampling_steps, self.timestep_fraction, self.train_last_step)


@dataclass
class OptimSettings:
    seed: int
    sampler_seed: int
    max_train_steps: int
    learning_rate: float
    weight_decay: float
    max_grad_norm: float
    lr_scheduler: str
    lr_warmup_steps: int
    lr_num_cycles: int
    lr_power: float
    use_ema: bool
    ema_decay: float
    ema_start_step: int
    max_nonfinite_steps: int


@dataclass
class OutputSettings:
    output_dir: str
    image_dir: str
    checkpointing_steps: int
    checkpoints_total_limit: int
    resume_from_checkpoint: str | None
    resume_allow_changes: bool
    save_images_every: int
    report_to: str
    record_dir: str | None
    record_tensors: bool
    dump_randomness: str | None
    load_randomness: str | None
    probe_layers: list[str] | None


@dataclass
class TrainConfig:
    data_json_path: str
    dataloader_num_workers: int
    prompts_per_rank: int
    model: ModelConfig
    rollout: RolloutSettings
    reward: RewardSettings
    grpo: GRPOSettings
    optim: OptimSettings
    output: OutputSettings
    fsdp_strategy: str
    cpu_offload: bool
    compat_notes: list[str] = field(default_factory=list)
    eval: object = None  # fastvideo.eval.settings.EvalSettings, None when evaluation is off
    lora: LoraSettings = field(default_factory=lambda: LoraSettings(False, 128, 256.0, 0.0, (), None))
    mix: sampling_mix.MixSettings = field(default_factory=sampling_mix.MixSettings)  # SDE window / solver (sampling.mix)

    def derived(self, world_size: int) -> dict:
        """Quantities users otherwise compute by hand; logged at start-up."""
        samples_per_rank = self.prompts_per_rank * self.rollout.num_generations
        micro = self.grpo.train_micro_batch_size
        micro_batches = math.ceil(samples_per_rank / micro)
        return {
            "world_size": world_size,
            "samples_per_iteration": samples_per_rank * world_size,
            "samples_per_rank": samples_per_rank,
            "trained_steps_per_sample": self.mix.trained_steps(self.grpo.trained_steps(self.rollout.sampling_steps),
                                                               self.grpo.candidate_steps(self.rollout.sampling_steps)),
            "micro_batches_per_rank": micro_batches,
            "optimizer_steps_per_iteration": math.ceil(micro_batches / self.grpo.gradient_accumulation_steps),
            "train_global_batch_size": micro * self.grpo.gradient_accumulation_steps * world_size,
        }

    def to_dict(self) -> dict:
        return asdict(self)


PROBE_KINDS = ("rope", "norm", "attention", "block", "vae")


def _fail(msg: str) -> None:
    raise ConfigError(msg)


def _reward_extras(args):
    from fastvideo.rewards.flags import extras_from_args

    try:
        return extras_from_args(args)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _reward_spec(args) -> list:
    from fastvideo.rewards.combine import RewardSpecError, legacy_reward_spec, parse_reward_spec
    from fastvideo.rewards.flags import spec_from_args

    try:
        mixgrpo = spec_from_args(args)  # MixGRPO's --reward_model flags; [] when not used
        spec = parse_reward_spec(args.rewards) if args.rewards else []
    except (RewardSpecError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
    if mixgrpo:
        return mixgrpo
    legacy = legacy_reward_spec(use_hpsv2=args.use_hpsv2, use_pickscore=args.use_pickscore)
    if spec and legacy:
        _fail("give the rewards either with --rewards or with --use_hpsv2/--use_pickscore, not both")
    spec = spec or legacy
    if not spec:
        _fail('no reward given: add --rewards NAME:WEIGHT (e.g. --rewards "hpsv2:1.0" or '
              '--rewards compressibility:1.0) or --use_hpsv2')
    return spec


def validate_args(args: argparse.Namespace) -> TrainConfig:
    """Check every cross-field rule once, up front, and build the typed config."""
    if args.sp_size != 1:
        _fail(f"--sp_size {args.sp_size}: sequence parallelism is not supported; use --sp_size 1")
    if args.t != 1 or args.num_latent_t != 1:
        _fail("--t and --num_latent_t must be 1: this trainer is for images")
    if args.cfg != 0.0:
        _fail(f"--cfg {args.cfg}: classifier-free guidance is not supported; FLUX.1-dev uses its guidance "
              "embedding (--guidance_scale)")
    if args.precondition_outputs:
        _fail("--precondition_outputs is not supported for FLUX (velocity prediction)")
    if args.mixed_precision == "fp16":
        _fail("--mixed_precision fp16 is not supported (overflows in FLUX); use bf16 or no")
    if args.use_group and args.num_generations < 2:
        _fail(f"--num_generations {args.num_generations}: a group needs at least 2 samples")
    if args.reward_group_norm and not args.use_group:
        _fail("--reward_group_norm normalises each reward within a prompt's group: it needs --use_group")
    if args.train_last_step and args.ignore_last:
        _fail("--train_last_step and --ignore_last contradict each other; give one (not training the last "
              "transition is the default)")
    if args.h <= 0 or args.w <= 0 or args.h % 16 or args.w % 16:
        _fail(f"--h {args.h} --w {args.w}: both must be positive multiples of 16")
    if not 0.0 < args.timestep_fraction <= 1.0:
        _fail(f"--timestep_fraction {args.timestep_fraction} must be in (0, 1]")
    if args.sampling_steps < 1 if args.train_last_step else args.sampling_steps < 2:
        _fail(f"--sampling_steps {args.sampling_steps} is too small")
    if args.eta <= 0:
        _fail(f"--eta {args.eta}: GRPO needs a stochastic sampler (eta > 0) to have log-probabilities")
    for name in ("train_batch_size", "rollout_batch_size", "train_micro_batch_size",
                 "gradient_accumulation_steps", "max_train_steps", "checkpointing_steps",
                 "reward_batch_size", "max_nonfinite_steps"):
        if getattr(args, name) < 1:
            _fail(f"--{name} must be at least 1")
    if args.dataloader_num_workers < 0:
        _fail("--dataloader_num_workers must be >= 0")
    if args.kl_coef < 0:
        _fail(f"--kl_coef {args.kl_coef} must be >= 0 (0 turns the KL penalty off)")
    if args.kl_coef > 0 and args.flow_grpo_sampling:
        _fail("--kl_coef is the KL between DanceGRPO's SDE steps; it is not implemented for --flow_grpo_sampling")
    if args.kl_coef > 0 and args.dpm_algorithm_type != "null" and args.dpm_apply_strategy == "all":
        _fail("--kl_coef is the KL between DanceGRPO's SDE steps; it is not implemented for the SDE-DPM-Solver "
              "steps of --dpm_apply_strategy all")
    lora = lora_settings(args)  # may set args.resume_from_checkpoint (--resume_from_lora_checkpoint)
    if args.clip_range <= 0 or args.adv_clip_max <= 0:
        _fail("--clip_range and --adv_clip_max must be positive")
    if not 0.0 <= args.selective_checkpointing <= 1.0:
        _fail("--selective_checkpointing must be in [0, 1]")
    if args.selective_checkpointing < 1.0 and not args.gradient_checkpointing:
        _fail("--selective_checkpointing needs --gradient_checkpointing")
    if args.use_ema and not 0.0 < args.ema_decay < 1.0:
        _fail(f"--ema_decay {args.ema_decay} must be in (0, 1)")
    if args.dump_randomness and args.load_randomness:
        _fail("--dump_randomness and --load_randomness cannot be used together")
    from diffusers.optimization import SchedulerType

    valid_schedulers = [t.value for t in SchedulerType]
    if args.lr_scheduler not in valid_schedulers:
        _fail(f"--lr_scheduler {args.lr_scheduler!r} is unknown; choose from {', '.join(valid_schedulers)}")
    if args.checkpoints_total_limit < 1:
        _fail("--checkpoints_total_limit must be at least 1")
    if args.use_cpu_offload and args.fsdp_sharding_strategy == "none":
        _fail("--use_cpu_offload needs FSDP sharding (--fsdp_sharding_strategy full or hybrid)")
    if args.record_tensors and not args.record_dir:
        _fail("--record_tensors needs --record_dir")
    probes = None
    if args.probe_layers:
        probes = list(PROBE_KINDS) if args.probe_layers == "all" else [s.strip() for s in args.probe_layers.split(",")]
        bad = [s for s in probes if s not in PROBE_KINDS]
        if bad:
            _fail(f"--probe_layers: unknown kind(s) {bad}; valid: all or {', '.join(PROBE_KINDS)}")
        if not args.record_dir:
            _fail("--probe_layers needs --record_dir (probe outputs are written there)")

    notes = []
    defaults = build_parser().parse_args(["--data_json_path", "x", "--pretrained_model_name_or_path", "x"])
    for name, why in COMPAT_ONLY_FLAGS.items():
        if getattr(args, name) != getattr(defaults, name):
            notes.append(f"--{name} is accepted for compatibility and has no effect: {why}")
    if not args.use_group and args.num_generations != 1:
        notes.append(f"--num_generations {args.num_generations} has no effect without --use_group: as upstream, "
                     "each prompt gets one sample and advantages are normalised over the gathered batch")

    from fastvideo import mixgrpo_compat

    notes += mixgrpo_compat.check_and_notes(args, _fail)
    out = OutputSettings(
        output_dir=args.output_dir,
        image_dir=args.image_dir or args.output_dir,
        checkpointing_steps=args.checkpointing_steps,
        checkpoints_total_limit=args.checkpoints_total_limit,
        resume_from_checkpoint=args.resume_from_checkpoint,
        resume_allow_changes=args.resume_allow_changes,
        save_images_every=args.save_images_every,
        report_to=args.report_to,
        record_dir=args.record_dir,
        record_tensors=args.record_tensors,
        dump_randomness=args.dump_randomness,
        load_randomness=args.load_randomness,
        probe_layers=probes,
    )
    return TrainConfig(
        data_json_path=args.data_json_path,
        dataloader_num_workers=args.dataloader_num_workers,
        prompts_per_rank=args.train_batch_size,
        model=ModelConfig(
            pretrained_model_name_or_path=args.pretrained_model_name_or_path,
            dit_model_name_or_path=args.dit_model_name_or_path,
            vae_model_path=args.vae_model_path or args.pretrained_model_name_or_path,
            vae_precision=args.vae_precision,
            master_weight_type=args.master_weight_type,
            mixed_precision=args.mixed_precision,
            allow_tf32=args.allow_tf32,
            gradient_checkpointing=args.gradient_checkpointing,
            selective_checkpointing=args.selective_checkpointing,
        ),
        rollout=RolloutSettings(
            height=args.h, width=args.w, sampling_steps=args.sampling_steps, eta=args.eta,
            shift=args.shift, guidance_scale=args.guidance_scale,
            quantize_timestep=not args.no_quantize_timestep,
            num_generations=args.num_generations if args.use_group else 1,
            rollout_batch_size=args.rollout_batch_size, init_same_noise=args.init_same_noise,
            share_ode_prefix=not args.no_share_ode_prefix,
        ),
        reward=RewardSettings(
            spec=_reward_spec(args), group_norm=args.reward_group_norm,
            hps_ckpt_dir=args.hps_ckpt_dir, hps_model_name=args.hps_model_name,
            pickscore_dir=args.pickscore_dir, pickscore_processor_dir=args.pickscore_processor_dir,
            clip_dir=args.clip_dir, device=args.reward_device, batch_size=args.reward_batch_size,
            overlap=args.reward_overlap, precision=args.reward_precision, extras=_reward_extras(args),
        ),
        grpo=GRPOSettings(
            use_group=args.use_group, adv_std=args.adv_std, train_last_step=args.train_last_step,
            timestep_fraction=args.timestep_fraction, clip_range=args.clip_range,
            adv_clip_max=args.adv_clip_max, loss_coef=args.loss_coef,
            train_micro_batch_size=args.train_micro_batch_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps, kl_coef=args.kl_coef,
        ),
        optim=OptimSettings(
            seed=args.seed,
            sampler_seed=args.sampler_seed if args.sampler_seed is not None else args.seed,
            max_train_steps=args.max_train_steps, learning_rate=args.learning_rate,
            weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm,
            lr_scheduler=args.lr_scheduler, lr_warmup_steps=args.lr_warmup_steps,
            lr_num_cycles=args.lr_num_cycles, lr_power=args.lr_power, use_ema=args.use_ema,
            ema_decay=args.ema_decay, ema_start_step=args.ema_start_step,
            max_nonfinite_steps=args.max_nonfinite_steps,
        ),
        output=out,
        fsdp_strategy=args.fsdp_sharding_strategy,
        cpu_offload=args.use_cpu_offload,
        compat_notes=notes,
        eval=_eval_settings(args),
        lora=lora,
        mix=sampling_mix.settings_from_args(args, candidate_steps(args.sampling_steps, args.train_last_step), _fail),
    )


def _eval_settings(args):
    from fastvideo.eval.settings import eval_settings_from_args

    try:
        return eval_settings_from_args(args, _reward_spec(args))
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def parse_config(argv: Sequence[str] | None = None) -> TrainConfig:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return validate_args(args)
    except UserError as exc:  # ConfigError, and a reward spec's own errors (unknown name, bad weight)
        parser.error(str(exc))
        raise  # unreachable: parser.error exits
