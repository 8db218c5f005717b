# syntax=docker/dockerfile:1
# hvdtrain for GPU hosts: CUDA 11.2 + cuDNN 8, NCCL 2.8, Open MPI, sshd (port 12345 for
# multi-host runs), RDMA user-space libraries, Python 3.8 (Ubuntu 20.04), numpy < 1.24,
# mxnet-cu112 1.9.1, Horovod 0.28.1 built with NCCL and MXNet, and hvdtrain.
# GPUs of compute capability 5.0-8.9 (Maxwell to Ada); not Hopper (docs/deployment.md).
#
#   DOCKER_BUILDKIT=1 docker build -t hvdtrain:gpu .
#   docker run --gpus all --shm-size=1g --rm hvdtrain:gpu \
#       horovodrun -np 2 -H localhost:2 hvdtrain --dataset synthetic --max-steps 20
#
# Two stages: `build` compiles Horovod in the CUDA devel image; the final stage is the CUDA
# runtime image with the virtual environment copied over, and no compilers or headers.
# Python is installed by scripts/install-deps.sh, the same script CI runs.

FROM nvidia/cuda:11.2.2-cudnn8-devel-ubuntu20.04 AS build

ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    VIRTUAL_ENV=/opt/hvdtrain/.venv \
    PATH=/opt/hvdtrain/.venv/bin:$PATH

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# NCCL must match CUDA 11.2, so it alone is pinned; the rest follow Ubuntu 20.04. Open MPI's
# headers and compiler wrappers for Horovod's MPI support.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends --allow-change-held-packages \
        libnccl2=2.8.4-1+cuda11.2 libnccl-dev=2.8.4-1+cuda11.2 \
        build-essential python3 python3-dev python3-venv openmpi-bin libopenmpi-dev \
    && rm -rf /var/lib/apt/lists/*

# Only what the heavy step reads: editing hvdtrain's sources, docs or examples reuses it.
WORKDIR /opt/hvdtrain
COPY setup.cfg constraints.txt ./
COPY scripts/install-deps.sh scripts/check_build.py ./scripts/

# MXNet, Horovod (NCCL, MXNet, Gloo, MPI) and hvdtrain's requirements, not hvdtrain itself.
# No GPU driver during `docker build`: MXNet and Horovod's build load libcuda.so.1, so the
# CUDA stub stands in for it here. The Horovod wheel and pip's downloads stay in BuildKit
# cache mounts, so a rebuild after a change to setup.cfg does not compile Horovod again.
RUN --mount=type=cache,target=/root/.cache \
    ln -s /usr/local/cuda/lib64/stubs/libcuda.so /usr/local/cuda/lib64/stubs/libcuda.so.1 \
    && ldconfig /usr/local/cuda/lib64/stubs \
    && HOROVOD_CUDA_HOME=/usr/local/cuda HOROVOD_NCCL_LINK=SHARED \
        bash scripts/install-deps.sh --gpu --no-apt --deps-only --extras tensorboard \
            --venv "$VIRTUAL_ENV" \
    && rm /usr/local/cuda/lib64/stubs/libcuda.so.1 && ldconfig


FROM nvidia/cuda:11.2.2-cudnn8-runtime-ubuntu20.04

ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/hvdtrain/.venv \
    PATH=/opt/hvdtrain/.venv/bin:$PATH

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# What jobs need: Python 3.8 for the copied venv (distutils: pip on 3.8 reads its paths),
# NCCL, Open MPI and ssh for horovodrun/mpirun across hosts, rsync for hvdtrain-launch, the
# libraries MXNet's wheel links (libgomp, libquadmath), and the RDMA user-space libraries so
# NCCL and Open MPI can use InfiniBand/RoCE (run with --cap-add IPC_LOCK --device
# /dev/infiniband).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends --allow-change-held-packages \
        libnccl2=2.8.4-1+cuda11.2 \
        python3 python3-distutils openmpi-bin openssh-server openssh-client rsync procps \
        libgomp1 libquadmath0 libibverbs1 librdmacm1 ibverbs-providers \
    && rm -rf /var/lib/apt/lists/*

# Multi-host runs: containers reach each other's sshd on port 12345 with a shared key. The
# settings live in /etc/ssh, so mounting your own keys at /root/.ssh keeps them.
RUN mkdir -p /run/sshd \
    && sed -i 's/^#\?Port 22$/Port 12345/' /etc/ssh/sshd_config \
    && grep -q '^Port 12345$' /etc/ssh/sshd_config \
    && printf '\nHost *\n    Port 12345\n    StrictHostKeyChecking no\n    UserKnownHostsFile /dev/null\n' \
        >> /etc/ssh/ssh_config

COPY --from=build /opt/hvdtrain/.venv /opt/hvdtrain/.venv

# hvdtrain itself last: a source edit rebuilds only these small layers.
WORKDIR /opt/hvdtrain
COPY setup.cfg setup.py pyproject.toml constraints.txt README.md ./
COPY hvdtrain ./hvdtrain
COPY scripts ./scripts
COPY hostfiles ./hostfiles
COPY examples ./examples
# Then prove this stage holds every library the imports load (libmpi, libnccl, cudart, cuDNN,
# libgomp), with the build stage's CUDA stub standing in for the driver for this one step.
RUN --mount=type=bind,from=build,source=/usr/local/cuda-11.2/targets/x86_64-linux/lib/stubs,target=/opt/cuda-stubs \
    pip install --no-cache-dir --no-deps --no-build-isolation --no-index -e . \
    && mkdir /tmp/driver-stub \
    && ln -s /opt/cuda-stubs/libcuda.so /tmp/driver-stub/libcuda.so.1 \
    && LD_LIBRARY_PATH=/tmp/driver-stub python scripts/check_build.py --gpu \
    && LD_LIBRARY_PATH=/tmp/driver-stub hvdtrain --help > /dev/null \
    && rm -rf /tmp/driver-stub

EXPOSE 12345
WORKDIR /workspace
CMD ["hvdtrain", "--help"]
