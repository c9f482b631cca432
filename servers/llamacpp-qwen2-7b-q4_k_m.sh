#!/usr/bin/env bash
# loadgen serve /models/qwen2-7b-instruct-q4_k_m.gguf --backend llamacpp --gpus 0 --slots 4
# llama.cpp serving /models/qwen2-7b-instruct-q4_k_m.gguf (as the GGUF file says) on GPU 0; setting default: max_model_len 32768
# Serves an OpenAI-compatible API at http://127.0.0.1:8000/v1; extra arguments go to the engine.
set -euo pipefail
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export CUDA_VISIBLE_DEVICES=0
exec llama-server -m /models/qwen2-7b-instruct-q4_k_m.gguf --host 127.0.0.1 --port 8000 --alias /models/qwen2-7b-instruct-q4_k_m.gguf -np 4 -c 131072 --metrics -ngl 999 "$@"
