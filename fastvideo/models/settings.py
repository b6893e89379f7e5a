"""The model component's settings: which model family, where its weights are, and in which
precision it runs and is trained."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fastvideo.errors import ConfigError
from fastvideo.settings import Settings, check_plugin_name, flag_group


def check_family_name(value: str) -> None:
    """--model_family: a registered family's name or a plugin path (fastvideo.settings.check_plugin_name)."""
    check_plugin_name("model_family", value, "flux, sd3")


@dataclass
class ModelConfig(Settings):
    pretrained_model_name_or_path: str
    dit_model_name_or_path: str | None
    vae_model_path: str
    vae_precision: str
    master_weight_type: str
    mixed_precision: str
    allow_tf32: bool
    gradient_checkpointing: bool
    selective_checkpointing: float
    family: str = "flux"  # a registered model family or a "pkg.module:Class" plugin (--model_family)
    compile: bool = False  # regional compilation of the family's blocks (models/compile.py)
    compile_backend: str = "auto"  # devices.compile_backend: auto = inductor on CUDA/CPU, TorchAir on NPU
    trainable_modules: str = "all"  # full fine-tuning's trained parameters (training/trainable.py)

    @classmethod
    def add_flags(cls, parser: argparse.ArgumentParser) -> None:
        flag_group(parser, "components").add_argument(
            "--model_family", type=str, default="flux",
            help='model family: a registered name (flux) or a plugin "pkg.module:Class"')
        g = flag_group(parser, "models")
        g.add_argument("--pretrained_model_name_or_path", type=str, required=True,
                       help="diffusers-layout FLUX folder (data/flux)")
        g.add_argument("--dit_model_name_or_path", type=str, default=None,
                       help="take the transformer from this folder instead (a FLUX folder or a transformer folder)")
        g.add_argument("--vae_model_path", type=str, default=None, help="FLUX folder to take the VAE from")
        g.add_argument("--vae_precision", type=str, default="auto", choices=["auto", "fp32", "bf16"],
                       help="VAE weights' dtype for decoding rollouts; auto: bf16 on GPU/NPU, fp32 on CPU")
        g = flag_group(parser, "optimisation")
        # fp16 is not listed (it overflows in FLUX) but still parses, so that check() can say why it is refused.
        g.add_argument("--mixed_precision", type=str, default="bf16", metavar="{no,bf16}",
                       help="autocast dtype of the transformer's forward passes (no: fp32)")
        g.add_argument("--master_weight_type", type=str, default="fp32", choices=["fp32", "bf16"],
                       help="dtype of the trained weights and of the optimizer state (bf16: Flow-Factory's "
                            "weights trained in place, AdamW state in bf16 too)")
        g.add_argument("--trainable_modules", type=str, default="all", metavar="{all,peer,PATTERN,...}",
                       help="which transformer parameters full fine-tuning trains: all (default); peer: the "
                            "family's Flow-Factory default target modules; or comma-separated module-name patterns "
                            "(a parameter trains when its name contains one, e.g. attn.to_q,attn.to_k)")
        g.add_argument("--allow_tf32", action="store_true", help="TF32 matmuls on CUDA, HF32 on NPU")
        g.add_argument("--gradient_checkpointing", action="store_true",
                       help="recompute transformer blocks in the backward pass to save memory")
        g.add_argument("--selective_checkpointing", type=float, default=1.0,
                       help="fraction of transformer blocks to checkpoint (from the first)")
        g.add_argument("--compile", action="store_true",
                       help="compile each transformer block class once (regional torch.compile, fullgraph) and "
                            "reuse it for every block of the class")
        g.add_argument("--compile_backend", type=str, default="auto", choices=["auto", "inductor", "aot_eager", "eager"],
                       help="--compile's backend: auto (inductor on CUDA/CPU, TorchAir on NPU); aot_eager and eager "
                            "trace without generating code (to find graph breaks)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ModelConfig":
        return cls(
            pretrained_model_name_or_path=args.pretrained_model_name_or_path,
            dit_model_name_or_path=args.dit_model_name_or_path,
            vae_model_path=args.vae_model_path or args.pretrained_model_name_or_path,
            vae_precision=args.vae_precision,
            master_weight_type=args.master_weight_type,
            mixed_precision=args.mixed_precision,
            allow_tf32=args.allow_tf32,
            gradient_checkpointing=args.gradient_checkpointing,
            selective_checkpointing=args.selective_checkpointing,
            family=args.model_family,
            compile=args.compile,
            compile_backend=args.compile_backend,
            trainable_modules=args.trainable_modules,
        ).checked()

    @classmethod
    def flags_from_resolved(cls, section: dict) -> dict:
        names = ("pretrained_model_name_or_path", "dit_model_name_or_path", "vae_model_path", "vae_precision",
                 "master_weight_type", "mixed_precision", "allow_tf32", "gradient_checkpointing",
                 "selective_checkpointing")
        flags = {**{n: section[n] for n in names}, "model_family": section["family"],
                 "compile": section.get("compile", False), "compile_backend": section.get("compile_backend", "auto"),
                 "trainable_modules": section.get("trainable_modules", "all")}
        if flags["vae_model_path"] == flags["pretrained_model_name_or_path"]:  # the default: follows a new model folder
            flags["vae_model_path"] = None
        return flags

    def check(self) -> None:
        if self.mixed_precision == "fp16":
            raise ConfigError("--mixed_precision fp16 is not supported (overflows in FLUX); use bf16 or no")
        if self.mixed_precision not in ("no", "bf16"):
            raise ConfigError(f"--mixed_precision {self.mixed_precision!r}: choose bf16 or no")
        if not 0.0 <= self.selective_checkpointing <= 1.0:
            raise ConfigError("--selective_checkpointing must be in [0, 1]")
        if self.selective_checkpointing < 1.0 and not self.gradient_checkpointing:
            raise ConfigError("--selective_checkpointing needs --gradient_checkpointing")
        check_family_name(self.family)
        if self.compile_backend != "auto" and not self.compile:
            raise ConfigError(f"--compile_backend {self.compile_backend} needs --compile")
        if not self.trainable_modules.strip() or any(not p.strip() for p in self.trainable_modules.split(",")):
            raise ConfigError(f"--trainable_modules {self.trainable_modules!r}: give all, peer or comma-separated "
                              "module-name patterns (attn.to_q,attn.to_k)")

    def check_across(self, sections: dict) -> None:
        if self.trainable_modules == "all":
            return
        if sections["lora"].enabled:
            raise ConfigError(f"--trainable_modules {self.trainable_modules} chooses full fine-tuning's weights; "
                              "with --use_lora choose the adapters' modules with --lora_target_modules")
        if sections["output"].checkpoint_format == "sharded":
            raise ConfigError("--trainable_modules trains part of the model: use --checkpoint_format gathered "
                              "(the default)")
