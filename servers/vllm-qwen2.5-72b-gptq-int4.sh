#!/usr/bin/env bash
# loadgen serve qwen2.5-72b --quant gptq-int4
# vLLM serving Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4 (gptq-int4) on GPU 0; setting default: max_model_len 32768, gpu_memory_utilization 0.9
# Serves an OpenAI-compatible API at http://127.0.0.1:8000/v1; extra arguments go to the engine.
set -euo pipefail
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export CUDA_VISIBLE_DEVICES=0
exec vllm serve Qwen/Qwen2.5-72B-Instruct-GPTQ-Int4 --host 127.0.0.1 --port 8000 --served-model-name qwen2.5-72b --enable-prompt-tokens-details --tensor-parallel-size 1 --dtype auto --gpu-memory-utilization 0.9 --max-model-len 32768 "$@"
