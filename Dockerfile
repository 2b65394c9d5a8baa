# Submission image: 4x T4 runtime. Weights are expected under models/weights/ (git-lfs in a submission).
# CUDA 12.9: what the vllm 0.14.1 wheel is built with (torch 2.9.1 brings its own CUDA 12 libraries as pip wheels).
# Host driver: >= 575.51.03 (CUDA 12.9's) is the safe assumption; CUDA 12 minor-version compatibility runs it on R525+
# data-center drivers (T4s), except kernels JIT-compiled from PTX. The wheel carries T4 (sm_75) kernels (sm_75 cubins
# in the fatbins of its vllm/_C.abi3.so, which reports "Cuda compilation tools, release 12.9, V12.9.86").
# Not built here (no Docker daemon): tests/integration/test_check_submission.py checks this file's base image and
# pins, and tools/check_submission.py's "image" row the base image's CUDA against the vllm pin.
FROM nvidia/cuda:12.9.1-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    CRAG_CONFIG=/home/aicrowd/configs/t4x4-llama3-70b-gptq.yaml

# Ubuntu's python3.11 packages follow the base image's release; pinning their exact build would break the build
# on every security update.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3-pip git \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1001 aicrowd

USER 1001
WORKDIR /home/aicrowd
ENV PATH=/home/aicrowd/.venv/bin:$PATH
COPY --chown=aicrowd:aicrowd requirements.txt ./
RUN python3.11 -m venv .venv && pip install --no-cache-dir -r requirements.txt
COPY --chown=aicrowd:aicrowd . .
