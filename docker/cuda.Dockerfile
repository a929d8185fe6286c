# tetriserve on NVIDIA GPUs: vllm 0.32.0 (CUDA), installed by scripts/setup.sh --engine gpu.
#   docker build -f docker/cuda.Dockerfile -t tetriserve:0.1.0-cuda .
#   docker run --rm --gpus all -p 8000:8000 -p 50051:50051 -v /models:/models tetriserve:0.1.0-cuda \
#       tetriserve serve --host 0.0.0.0 --model /models/Llama-3.1-8B-Instruct --dtype bfloat16
# The image is not built in CI (no container runtime there); tests/unit/test_container_images.py checks that it
# installs through scripts/setup.sh, which CI runs, and that the Helm chart's GPU example names this image.

ARG CUDA_VERSION=12.8.1
ARG UBUNTU=ubuntu22.04

FROM nvidia/cuda:${CUDA_VERSION}-devel-${UBUNTU} AS build
ARG DEBIAN_FRONTEND=noninteractive
# Python 3.11, the version tetriserve pins, from the deadsnakes archive (Ubuntu 22.04 ships 3.10)
RUN apt-get update \
    && apt-get install -y --no-install-recommends software-properties-common gpg-agent git build-essential \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-dev python3.11-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/tetriserve
COPY . .
ENV PYTHON=python3.11 \
    TETRISERVE_HOME=/opt/tetriserve/home \
    PIP_NO_CACHE_DIR=1
# The build machine need not have a GPU: the engine is named, not detected.
RUN scripts/setup.sh --engine gpu

FROM nvidia/cuda:${CUDA_VERSION}-runtime-${UBUNTU}
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends software-properties-common gpg-agent \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 libnuma1 procps \
    && apt-get purge -y software-properties-common gpg-agent && apt-get autoremove -y \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 --shell /bin/bash tetriserve
COPY --from=build --chown=tetriserve:tetriserve /opt/tetriserve /opt/tetriserve
ENV PATH=/opt/tetriserve/.venv/bin:$PATH \
    TETRISERVE_HOME=/opt/tetriserve/home \
    HF_HUB_OFFLINE=1
USER tetriserve
WORKDIR /home/tetriserve
EXPOSE 8000 50051 8265
CMD ["tetriserve", "serve", "--host", "0.0.0.0"]
