"""Every reward weight the project loads: where it goes, where it comes from, whether the repository is
gated, and the command that fetches it. The one source of the README's "Reward weights" table
(tests/rewards/test_reward_weights_table.py holds the two equal), of the reward flags' default folders,
and of every missing-weights line (the rewards' own checks and the launcher's pre-flight).

The layout: DanceGRPO's and MixGRPO's own folders where their scripts name one (``hps_ckpt/``,
``image_reward_ckpt/``), ``data/<reward>`` beside the models otherwise (``data/pickscore``,
``data/clip``, ``data/aesthetic``). Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Weight:
    """One downloaded item: ``files`` from ``source`` into ``folder``."""

    reward: str  # the reward (or rewards, "clip, clip_edit") that reads it
    what: str
    folder: str  # the default folder (the flag's default and the launchers')
    flag: str  # the trainer's flag that points at the folder
    variable: str  # the launchers' variable that sets that flag
    files: str  # what ends up in the folder
    source: str  # Hugging Face repo id (or the URL of a file elsewhere)
    gated: bool
    command: str


HF = "huggingface-cli download"
VIDEOALIGN = ("data/videoalign", "--videoalign_dir", "VIDEOALIGN_DIR")  # folder, flag, launcher variable
WEIGHTS = (
    Weight("hpsv2", "HPSv2.1", "hps_ckpt", "--hps_ckpt_dir", "HPS_DIR", "HPS_v2.1_compressed.pt", "xswu/HPSv2",
           False, f"{HF} xswu/HPSv2 HPS_v2.1_compressed.pt --local-dir hps_ckpt"),
    Weight("hpsv2", "HPS's CLIP ViT-H-14 (open_clip)", "hps_ckpt", "--hps_ckpt_dir", "HPS_DIR",
           "open_clip_pytorch_model.bin", "laion/CLIP-ViT-H-14-laion2B-s32B-b79K", False,
           f"{HF} laion/CLIP-ViT-H-14-laion2B-s32B-b79K open_clip_pytorch_model.bin --local-dir hps_ckpt"),
    Weight("pickscore", "PickScore_v1 model", "data/pickscore", "--pickscore_dir", "PICKSCORE_DIR",
           "config.json + model weights (CLIPModel)", "yuvalkirstain/PickScore_v1", False,
           f"{HF} yuvalkirstain/PickScore_v1 --local-dir data/pickscore"),
    Weight("pickscore", "PickScore's processor (CLIP ViT-H-14's)", "data/pickscore", "--pickscore_dir",
           "PICKSCORE_DIR", "preprocessor_config.json + tokenizer files (CLIPProcessor)",
           "laion/CLIP-ViT-H-14-laion2B-s32B-b79K", False,
           f'{HF} laion/CLIP-ViT-H-14-laion2B-s32B-b79K --include "preprocessor_config.json" "tokenizer*" '
           f'"vocab.json" "merges.txt" "special_tokens_map.json" --local-dir data/pickscore'),
    Weight("clip, clip_edit", "CLIP ViT-L/14", "data/clip", "--clip_dir", "CLIP_DIR",
           "config.json + model.safetensors + processor files", "openai/clip-vit-large-patch14", False,
           f'{HF} openai/clip-vit-large-patch14 --include "*.json" "*.txt" "model.safetensors" --local-dir data/clip'),
    Weight("aesthetic", "LAION aesthetic predictor (MLP)", "data/aesthetic", "--aesthetic_dir", "AESTHETIC_DIR",
           "sac+logos+ava1-l14-linearMSE.pth",
           "https://github.com/christophschuhmann/improved-aesthetic-predictor", False,
           "curl -L --create-dirs -o data/aesthetic/sac+logos+ava1-l14-linearMSE.pth "
           "https://github.com/christophschuhmann/improved-aesthetic-predictor/raw/main/sac%2Blogos%2Bava1-l14-linearMSE.pth"),
    Weight("aesthetic", "its CLIP ViT-L/14 (OpenAI, open_clip layout)", "data/aesthetic", "--aesthetic_dir",
           "AESTHETIC_DIR", "open_clip_pytorch_model.bin", "timm/vit_large_patch14_clip_224.openai", False,
           f"{HF} timm/vit_large_patch14_clip_224.openai open_clip_pytorch_model.bin --local-dir data/aesthetic"),
    Weight("imagereward", "ImageReward", "image_reward_ckpt", "--image_reward_dir", "IMAGE_REWARD_DIR",
           "ImageReward.pt + med_config.json", "THUDM/ImageReward", False,
           f"{HF} THUDM/ImageReward ImageReward.pt med_config.json --local-dir image_reward_ckpt"),
    Weight("imagereward", "its tokenizer (bert-base-uncased)", "image_reward_ckpt", "--image_reward_dir",
           "IMAGE_REWARD_DIR", "vocab.txt", "google-bert/bert-base-uncased", False,
           f"{HF} google-bert/bert-base-uncased vocab.txt --local-dir image_reward_ckpt"),
    Weight("videoalign", "VideoReward (VideoAlign)", *VIDEOALIGN, "model_config.json + checkpoint-N/",
           "KwaiVGI/VideoReward", False, f"{HF} KwaiVGI/VideoReward --local-dir data/videoalign"),
    Weight("videoalign", "its base model Qwen2-VL-2B-Instruct", *VIDEOALIGN,
           "Qwen2-VL-2B-Instruct/ (config.json, weights, tokenizer and processor files)", "Qwen/Qwen2-VL-2B-Instruct",
           False, f"{HF} Qwen/Qwen2-VL-2B-Instruct --local-dir data/videoalign/Qwen2-VL-2B-Instruct"),
)


def weights_of(reward: str) -> tuple[Weight, ...]:
    """The rows a reward reads (``reward``: a registered name, e.g. "clip_edit")."""
    rows = tuple(w for w in WEIGHTS if reward in (n.strip() for n in w.reward.split(",")))
    if not rows:
        raise KeyError(f"no reward weights are listed for {reward!r}")
    return rows


def default_folder(reward: str) -> str:
    """The default folder of ``reward``'s weights (its flag's default and the launchers')."""
    return weights_of(reward)[0].folder


def where_to_get(reward: str, folder: str | None = None) -> str:
    """One sentence for a missing-weights line: the flag and launcher variable that point at the
    folder, and for each item its source, whether gated, and the command (into ``folder`` when the
    run uses another folder than the default)."""
    rows = weights_of(reward)
    first = rows[0]
    items = []
    for w in rows:
        command = w.command if folder in (None, w.folder) else w.command.replace(w.folder, str(folder).rstrip("/"))
        items.append(f"{w.files} from {w.source}{' (gated: accept its licence on the model page first)' if w.gated else ''}"
                     f": {command}")
    return (f"point {first.flag} (launchers: {first.variable}=DIR) at the folder that holds them, or fetch "
            f"{'; '.join(items)} (README \"Reward weights\")")


def readme_table() -> list[str]:
    """The README's "Reward weights" table, one line per row."""
    lines = ["| reward | what | folder (flag; launcher variable) | files | from | gated | download |",
             "|---|---|---|---|---|---|---|"]
    for w in WEIGHTS:
        lines.append(f"| `{w.reward}` | {w.what} | `{w.folder}/` (`{w.flag}`; `{w.variable}`) | {w.files} | "
                     f"{w.source} | {'yes' if w.gated else 'no'} | `{w.command}` |")
    return lines
