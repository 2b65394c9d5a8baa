# Submission image: 4x T4 runtime. Weights are expected under models/weights/ (git-lfs in a submission).
FROM nvidia/cuda:12.1.1-cudnn8-runtime-ubuntu22.04

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
