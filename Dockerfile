# sparsek on NVIDIA's CUDA 13 development image: installs the build and test dependencies, builds
# the library, runs the whole test suite (GPU tests skip while the image is built: no GPU is
# visible then) and, by default, `sparsek doctor`.
#
#   docker build -t sparsek .
#   docker run --rm --gpus all sparsek                 # sparsek doctor on your GPU
#   docker run --rm --gpus all sparsek make test       # the suite again, GPU tests included
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PATH=/opt/venv/bin:/usr/local/cuda/bin:$PATH
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake ninja-build g++ make libgtest-dev pkg-config libopenblas-dev \
      cargo python3 python3-venv python3-dev \
 && rm -rf /var/lib/apt/lists/*
# Python packages go into a venv (Ubuntu's system Python refuses pip installs).
RUN python3 -m venv /opt/venv

WORKDIR /src/sparsek
COPY . .
RUN make test JOBS="$(nproc)"

CMD ["build/sparsek", "doctor"]
