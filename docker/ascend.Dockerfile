# flux-grpo on Ascend NPUs (Atlas A2 / A3) (docs/containers.md).
# The base is an Ascend CANN image (quay.io/ascend/cann, tags <cann>-<chip>-<os>-<python>: chip a3 for
# Atlas A3, 910b for Atlas A2). env_setup.sh reads the CANN version from the image's CANN tree and installs
# the torch / torch-npu pair built for it (scripts/install_plan.py; 8.5.0 pairs with torch-npu 2.7.1.post2
# on the recipe line and 2.9.0 on the current line). The NPU driver is the host's, mounted at run time,
# so the build installs torch_npu without importing it.
#
#   docker build -f docker/ascend.Dockerfile -t flux-grpo:ascend .
#   docker build -f docker/ascend.Dockerfile --build-arg CANN_IMAGE=quay.io/ascend/cann:8.5.0-910b-ubuntu22.04-py3.11 -t flux-grpo:ascend-a2 .
#   docker run --rm -it --ipc=host --network=host $(for i in $(seq 0 15); do echo --device /dev/davinci$i; done) \
#       --device /dev/davinci_manager --device /dev/devmm_svm --device /dev/hisi_hdc \
#       -v /usr/local/Ascend/driver:/usr/local/Ascend/driver:ro -v /usr/local/dcmi:/usr/local/dcmi:ro \
#       -v /usr/local/bin/npu-smi:/usr/local/bin/npu-smi:ro -v /data/weights:/workspace/flux_grpo/data \
#       flux-grpo:ascend bash scripts/finetune/finetune_flux_grpo_a3_16die.sh
ARG CANN_IMAGE=quay.io/ascend/cann:8.5.0-a3-ubuntu22.04-py3.11
FROM ${CANN_IMAGE}

ARG LINE=recipe
ENV LINE=${LINE} PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /workspace/flux_grpo
COPY . .
RUN bash env_setup.sh --target npu --line "${LINE}"
CMD ["bash"]
