#!/usr/bin/env bash
# loadgen serve qwen2.5-72b --quant awq --setting 2
# vLLM serving Qwen/Qwen2.5-72B-Instruct-AWQ (awq) on GPU 0; setting 2: max_model_len 4096, gpu_memory_utilization 1, eager
# Serves an OpenAI-compatible API at http://127.0.0.1:8000/v1; extra arguments go to the engine.
set -euo pipefail
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export CUDA_VISIBLE_DEVICES=0
exec vllm serve Qwen/Qwen2.5-72B-Instruct-AWQ --host 127.0.0.1 --port 8000 --served-model-name qwen2.5-72b --enable-prompt-tokens-details --tensor-parallel-size 1 --dtype auto --gpu-memory-utilization 1.0 --max-model-len 4096 --enforce-eager "$@"
