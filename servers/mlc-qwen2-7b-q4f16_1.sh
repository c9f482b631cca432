#!/usr/bin/env bash
# loadgen serve qwen2-7b --backend mlc --quant q4f16_1 --gpus 0
# MLC LLM serving Qwen/Qwen2-7B-Instruct (q4f16_1) on GPU 0; setting default: max_model_len 32768
# Serves an OpenAI-compatible API at http://127.0.0.1:8000/v1; extra arguments go to the engine.
set -euo pipefail
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export CUDA_VISIBLE_DEVICES=0
exec mlc_llm serve HF://mlc-ai/Qwen2-7B-Instruct-q4f16_1-MLC --device cuda --mode server --host 127.0.0.1 --port 8000 --overrides 'tensor_parallel_shards=1;max_num_sequence=16;context_window_size=32768' "$@"
