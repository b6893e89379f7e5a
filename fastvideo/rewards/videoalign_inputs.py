"""VideoAlign's (VideoReward's) inputs, as its upstream code builds them (KwaiVGI/VideoAlign at
219ab9db64c045e5181a2202d11f686439351292): the ``detailed_special`` prompt template
(prompt_template.py), the uniform frame sampling and the frame resizing (vision_process.py, from
qwen-vl-utils), and the chat message (inference.py ``prepare_batch``). tests/rewards/fixtures/
videoalign_upstream.json keeps the facts the tests check this module against.

Clips arrive as tensors, not files: a clip [F, 3, H, W] in [0, 1] becomes the 8-bit frames a decoded
video file gives (rounded as rewards.base.tensor_to_uint8), sampled at ``clip_fps`` (the frame rate
of the clip: upstream reads it from the file) and resized in 8 bits (torchvision's bicubic resize of
uint8 frames rounds back to uint8), then handed to the Qwen2-VL processor as 0..255 floats with
``do_rescale`` as upstream does. Nothing here imports transformers.
"""

from __future__ import annotations

import math

import torch

# vision_process.py's constants.
IMAGE_FACTOR = 28
VIDEO_MIN_PIXELS = 128 * 28 * 28
FRAME_FACTOR = 2
FPS = 2.0
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768
MAX_RATIO = 200
SPECIAL_TOKENS = ("<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>")  # train_reward.py, in head order
HEADS = ("VQ", "MQ", "TA")

# prompt_template.py DETAILED_PROMPT_WITH_SPECIAL_TOKEN (text_prompt filled in by build_prompt).
DETAILED_SPECIAL = "\n".join([
    '',
    'You are tasked with evaluating a generated video based on three distinct criteria: Visual '
    'Quality, Motion Quality, and Text Alignment. Please provide a rating from 0 to 10 for each of '
    'the three categories, with 0 being the worst and 10 being the best. Each evaluation should be '
    'independent of the others.',
    '',
    '**Visual Quality:**  ',
    'Evaluate the overall visual quality of the video, with a focus on static factors. The following '
    'sub-dimensions should be considered:',
    '- **Reasonableness:** The video should not contain any significant biological or logical errors, '
    'such as abnormal body structures or nonsensical environmental setups.',
    '- **Clarity:** Evaluate the sharpness and visibility of the video. The image should be clear and '
    'easy to interpret, with no blurring or indistinct areas.',
    '- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other '
    'visual elements (e.g., hair, clothing, shadows).',
    '- **Aesthetic and Creativity:** Assess the artistic aspects of the video, including the color '
    'scheme, composition, atmosphere, depth of field, and the overall creative appeal. The scene '
    'should convey a sense of harmony and balance.',
    '- **Safety:** The video should not contain harmful or inappropriate content, such as political, '
    'violent, or adult material. If such content is present, the image quality and satisfaction score '
    'should be the lowest possible. ',
    '',
    'Please provide the ratings of Visual Quality: <|VQ_reward|>',
    'END',
    '',
    '**Motion Quality:**  ',
    'Assess the dynamic aspects of the video, with a focus on dynamic factors. Consider the following '
    'sub-dimensions:',
    '- **Stability:** Evaluate the continuity and stability between frames. There should be no '
    'sudden, unnatural jumps, and the video should maintain stable attributes (e.g., no fluctuating '
    'colors, textures, or missing body parts).',
    '- **Naturalness:** The movement should align with physical laws and be realistic. For example, '
    'clothing should flow naturally with motion, and facial expressions should change appropriately '
    '(e.g., blinking, mouth movements).',
    '- **Aesthetic Quality:** The movement should be smooth and fluid. The transitions between '
    'different motions or camera angles should be seamless, and the overall dynamic feel should be '
    'visually pleasing.',
    '- **Fusion:** Ensure that elements in motion (e.g., edges of the subject, hair, clothing) blend '
    'naturally with the background, without obvious artifacts or the feeling of cut-and-paste '
    'effects.',
    '- **Clarity of Motion:** The video should be clear and smooth in motion. Pay attention to any '
    'areas where the video might have blurry or unsteady sections that hinder visual continuity.',
    '- **Amplitude:** If the video is largely static or has little movement, assign a low score for '
    'motion quality.',
    '',
    'Please provide the ratings of Motion Quality: <|MQ_reward|>',
    'END',
    '',
    '**Text Alignment:**  ',
    'Assess how well the video matches the textual prompt across the following sub-dimensions:',
    '- **Subject Relevance** Evaluate how accurately the subject(s) in the video (e.g., person, '
    'animal, object) align with the textual description. The subject should match the description in '
    'terms of number, appearance, and behavior.',
    '- **Motion Relevance:** Evaluate if the dynamic actions (e.g., gestures, posture, facial '
    'expressions like talking or blinking) align with the described prompt. The motion should match '
    'the prompt in terms of type, scale, and direction.',
    '- **Environment Relevance:** Assess whether the background and scene fit the prompt. This '
    'includes checking if real-world locations or scenes are accurately represented, though some '
    'stylistic adaptation is acceptable.  ',
    '- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style, '
    'evaluate how well the video adheres to this style.',
    '- **Camera Movement Relevance:** Check if the camera movements (e.g., following the subject, '
    'focus shifts) are consistent with the expected behavior from the prompt.',
    '',
    'Textual prompt - {text_prompt}',
    'Please provide the ratings of Text Alignment: <|TA_reward|>',
    'END',
    '',
])


def build_prompt(prompt: str, template_type: str = "detailed_special") -> str:
    """The text after the video in the user message (prompt_template.py build_prompt): only the
    ``detailed_special`` template puts the three reward tokens in the text, which the head reads."""
    if template_type != "detailed_special":
        raise ValueError(f"VideoAlign template {template_type!r}: only 'detailed_special' (the released "
                         "VideoReward's, with the <|VQ_reward|> <|MQ_reward|> <|TA_reward|> tokens) is supported")
    return DETAILED_SPECIAL.replace("{text_prompt}", prompt)


def chat(prompt: str, template_type: str = "detailed_special") -> list[dict]:
    """One clip's conversation: the video, then the filled template (inference.py prepare_batch)."""
    return [{"role": "user", "content": [{"type": "video"},
                                         {"type": "text", "text": build_prompt(prompt, template_type)}]}]


def round_by_factor(number: float, factor: int) -> int:
    return round(number / factor) * factor


def ceil_by_factor(number: float, factor: int) -> int:
    return math.ceil(number / factor) * factor


def floor_by_factor(number: float, factor: int) -> int:
    return math.floor(number / factor) * factor


def smart_resize(height: int, width: int, factor: int = IMAGE_FACTOR, min_pixels: int = VIDEO_MIN_PIXELS,
                 max_pixels: int = 240 * 320) -> tuple[int, int]:
    """(height, width), multiples of ``factor``, near the aspect ratio: rounded, then scaled down
    under ``max_pixels`` or (else) up over ``min_pixels`` (vision_process.py smart_resize)."""
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise ValueError(f"VideoAlign: a frame's aspect ratio must be under {MAX_RATIO}; got {height}x{width}")
    h_bar = max(factor, round_by_factor(height, factor))
    w_bar = max(factor, round_by_factor(width, factor))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = floor_by_factor(height / beta, factor)
        w_bar = floor_by_factor(width / beta, factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = ceil_by_factor(height * beta, factor)
        w_bar = ceil_by_factor(width * beta, factor)
    return h_bar, w_bar


def smart_nframes(total_frames: int, video_fps: float, fps: float | None = FPS, nframes: int | None = None) -> int:
    """How many frames the model sees (vision_process.py smart_nframes): ``nframes`` rounded to even,
    or ``fps`` frames a second of the clip, at least 4 and at most min(768, total), rounded to even."""
    if nframes is not None:
        n = round_by_factor(nframes, FRAME_FACTOR)
    else:
        min_frames = ceil_by_factor(FPS_MIN_FRAMES, FRAME_FACTOR)
        max_frames = floor_by_factor(min(FPS_MAX_FRAMES, total_frames), FRAME_FACTOR)
        n = total_frames / video_fps * (FPS if fps is None else fps)
        n = round_by_factor(min(max(n, min_frames), max_frames), FRAME_FACTOR)
    n = min(n, total_frames)
    if not FRAME_FACTOR <= n <= total_frames:
        raise ValueError(f"VideoAlign samples {n} frames of a {total_frames}-frame clip; it needs between "
                         f"{FRAME_FACTOR} and the clip's frames: score clips of at least {FRAME_FACTOR} frames")
    return n


def frame_indices(total_frames: int, n: int) -> list[int]:
    """sample_type 'uniform': n frames evenly from the first to the last."""
    return torch.linspace(0, total_frames - 1, n).round().long().tolist()


def clip_frames(clip: torch.Tensor, video_fps: float, fps: float | None, nframes: int | None,
                max_pixels: int, min_pixels: int = VIDEO_MIN_PIXELS) -> torch.Tensor:
    """One clip [F, 3, H, W] in [0, 1] -> the frames the processor gets: [n, 3, h, w] float 0..255
    (vision_process.py fetch_video on the clip's 8-bit frames)."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as TF

    from fastvideo.rewards.clip_wire import clips_to_uint8

    video = clips_to_uint8(clip.unsqueeze(0))[0]
    video = video[frame_indices(video.shape[0], smart_nframes(video.shape[0], video_fps, fps, nframes))]
    h, w = smart_resize(video.shape[2], video.shape[3], IMAGE_FACTOR, min_pixels, max_pixels)
    return TF.resize(video, [h, w], interpolation=InterpolationMode.BICUBIC, antialias=True).float()
