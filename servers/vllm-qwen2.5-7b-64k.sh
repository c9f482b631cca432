#!/usr/bin/env bash
# loadgen serve qwen2.5-7b --setting 64k --gpus 0
# vLLM serving Qwen/Qwen2.5-7B-Instruct (bf16) on GPU 0; setting 64k: max_model_len 65536, gpu_memory_utilization 0.9
# Serves an OpenAI-compatible API at http://127.0.0.1:8000/v1; extra arguments go to the engine.
set -euo pipefail
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export CUDA_VISIBLE_DEVICES=0
exec vllm serve Qwen/Qwen2.5-7B-Instruct --host 127.0.0.1 --port 8000 --served-model-name qwen2.5-7b --enable-prompt-tokens-details --tensor-parallel-size 1 --dtype bfloat16 --gpu-memory-utilization 0.9 --max-model-len 65536 --hf-overrides '{"rope_scaling":{"rope_type":"yarn","factor":4.0,"original_max_position_embeddings":32768}}' "$@"
