# One image for every Pagoda process: `pagoda router`, `pagoda worker`, `pagoda serve`.
#
#   docker build -t pagoda .          # PyTorch's default (CUDA) build: GPU hosts
#   docker build -t pagoda --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu .
#   docker run --rm -p 8000:8000 pagoda serve Qwen/Qwen2.5-0.5B-Instruct --num-workers 1
FROM python:3.11-slim

# g++: CPU workers compile their attention kernel on first use.
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

ENV HF_HOME=/models PYTHONUNBUFFERED=1
EXPOSE 8000 50050 50051
ENTRYPOINT ["pagoda"]
CMD ["--help"]
