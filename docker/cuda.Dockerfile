# flux-grpo on NVIDIA GPUs (docs/containers.md).
# torch's CUDA wheels carry the CUDA runtime, so the image needs no CUDA base: the host needs the
# NVIDIA driver and the NVIDIA Container Toolkit (`docker run --gpus all`).
#
#   docker build -f docker/cuda.Dockerfile -t flux-grpo:cuda .                              # recipe line
#   docker build -f docker/cuda.Dockerfile --build-arg LINE=current -t flux-grpo:cuda-current .
#   docker run --gpus all --ipc=host -v /data/weights:/workspace/flux_grpo/data flux-grpo:cuda \
#       bash scripts/finetune/finetune_flux_grpo_8gpus.sh
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

# recipe: diffusers 0.32 (FLUX.1, SD3.5, Kontext); current: diffusers 0.42 (every family). One line per image:
# each line is its own environment (about 6 GB with CUDA torch).
ARG LINE=recipe
ENV LINE=${LINE} PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends git procps \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /workspace/flux_grpo
COPY . .
# The same set-up as on a host: .venv for the recipe line, .venv-current for the current one, with LoRA
# (peft), the reward server (fastapi, uvicorn) and MP4 writing (av); the launchers find it there.
RUN bash env_setup.sh --target cuda --line "${LINE}"
CMD ["bash"]
