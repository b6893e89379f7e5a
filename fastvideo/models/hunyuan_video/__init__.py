"""HunyuanVideo (text to video, guidance-distilled) as a model family: ``--model_family hunyuan_video``.

family.py (HunyuanVideoFamily), components.py (loading, Llama + CLIP prompts, the velocity, decoding),
settings.py (--num_frames, section "hunyuan_video"); docs/hunyuan_video.md.
"""
