#!/usr/bin/env bash
# loadgen serve qwen2.5-7b --backend tgi --gpus 0
# TGI serving Qwen/Qwen2.5-7B-Instruct (bf16) on GPU 0; setting default: max_model_len 32768, gpu_memory_utilization 0.9
# Serves an OpenAI-compatible API at http://127.0.0.1:8000/v1; extra arguments go to the engine.
set -euo pipefail
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export CUDA_VISIBLE_DEVICES=0
exec text-generation-launcher --model-id Qwen/Qwen2.5-7B-Instruct --hostname 127.0.0.1 --port 8000 --num-shard 1 --dtype bfloat16 --max-total-tokens 32768 --max-input-tokens 32767 --cuda-memory-fraction 0.9 "$@"
