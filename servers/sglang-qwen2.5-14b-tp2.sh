#!/usr/bin/env bash
# loadgen serve qwen2.5-14b --backend sglang --gpus 0,1
# SGLang serving Qwen/Qwen2.5-14B-Instruct (bf16) on GPUs 0,1, tensor parallel 2; setting default: max_model_len 32768, gpu_memory_utilization 0.9
# Serves an OpenAI-compatible API at http://127.0.0.1:8000/v1; extra arguments go to the engine.
set -euo pipefail
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export CUDA_VISIBLE_DEVICES=0,1
exec "${PYTHON:-python3}" -m sglang.launch_server --model-path Qwen/Qwen2.5-14B-Instruct --host 127.0.0.1 --port 8000 --served-model-name qwen2.5-14b --tp 2 --dtype bfloat16 --mem-fraction-static 0.9 --context-length 32768 --enable-metrics --enable-cache-report "$@"
