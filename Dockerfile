# hvdtrain for GPU hosts: CUDA 11.2 + cuDNN 8, Open MPI, sshd (port 12345 for multi-host runs),
# numpy < 1.24, mxnet-cu112 1.9.1, Horovod 0.28.1 built with NCCL and MXNet, and hvdtrain.
#
#   docker build -t hvdtrain:gpu .
#   docker run --gpus all --rm hvdtrain:gpu horovodrun -np 4 -H localhost:4 hvdtrain --dataset synthetic
#
# Everything Python is installed by scripts/install-deps.sh --gpu, the same script CI runs.
FROM nvidia/cuda:11.2.2-cudnn8-devel-ubuntu20.04

ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/hvdtrain/.venv \
    PATH=/opt/hvdtrain/.venv/bin:$PATH \
    HVDTRAIN_WHEEL_CACHE=/tmp/wheels

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# NCCL for Horovod's GPU allreduce (matching CUDA 11.2); a compiler and Python headers to build
# Horovod. Open MPI, sshd and rsync come from install-deps.sh below. Only NCCL is pinned: it
# must match CUDA 11.2; the rest follow the base image's Ubuntu release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends --allow-change-held-packages \
        libnccl2=2.8.4-1+cuda11.2 libnccl-dev=2.8.4-1+cuda11.2 \
        build-essential git python3 python3-dev python3-venv python3-pip \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/hvdtrain
COPY setup.cfg pyproject.toml constraints.txt README.md ./
COPY hvdtrain ./hvdtrain
COPY scripts ./scripts
COPY hostfiles ./hostfiles
COPY examples ./examples

# No GPU driver during `docker build`: MXNet and Horovod's build load libcuda.so.1, so the CUDA
# stub stands in for it while building and is dropped again afterwards.
RUN ln -s /usr/local/cuda/lib64/stubs/libcuda.so /usr/local/cuda/lib64/stubs/libcuda.so.1 \
    && ldconfig /usr/local/cuda/lib64/stubs \
    && HOROVOD_CUDA_HOME=/usr/local/cuda HOROVOD_NCCL_LINK=SHARED \
        bash scripts/install-deps.sh --gpu --venv "$VIRTUAL_ENV" \
    && rm /usr/local/cuda/lib64/stubs/libcuda.so.1 && ldconfig \
    && rm -rf /tmp/wheels /root/.cache/pip /var/lib/apt/lists/*

# Multi-host runs: containers reach each other's sshd on port 12345 with a shared key
# (mount your own at /root/.ssh, or build an image with it baked in for a private cluster).
RUN mkdir -p /run/sshd /root/.ssh \
    && sed -i 's/^#\?Port 22$/Port 12345/' /etc/ssh/sshd_config \
    && printf 'Host *\n    Port 12345\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n' \
        > /root/.ssh/config \
    && chmod 600 /root/.ssh/config

EXPOSE 12345
WORKDIR /workspace
CMD ["hvdtrain", "--help"]
