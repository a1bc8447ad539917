# One image for every Pagoda process: `pagoda router`, `pagoda worker`, `pagoda serve`.
#
#   docker build -t pagoda .          # PyTorch's default (CUDA) build: GPU hosts
#   docker build -t pagoda --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu .
#   docker run --rm -p 8000:8000 pagoda serve Qwen/Qwen2.5-0.5B-Instruct --num-workers 1
FROM python:3.11-slim

# g++: the CPU kernels compile at image build (below), or where the CPU differs, on
# the first start.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

ARG TORCH_INDEX=https://pypi.org/simple
WORKDIR /app
# PyTorch first: the largest layer, and the one that changes least.
RUN pip install --no-cache-dir --index-url "$TORCH_INDEX" "torch>=2.4"
COPY pyproject.toml README.md ./
COPY shared shared
COPY kernels kernels
COPY worker worker
COPY router router
COPY bench bench
RUN pip install --no-cache-dir .
# The CPU kernels, built now for this build machine's CPU (-march=native; the cache is
# keyed by CPU model, so a host with another CPU builds its own once, logging it).
# Mount a volume at PAGODA_KERNEL_CACHE to keep such a build across containers.
ENV PAGODA_KERNEL_CACHE=/opt/pagoda/kernels
RUN pagoda build-kernels

ENV HF_HOME=/models PYTHONUNBUFFERED=1
EXPOSE 8000 50050 50051
ENTRYPOINT ["pagoda"]
CMD ["--help"]
