#!/usr/bin/env bash
# loadgen serve qwen2-7b --backend exllamav2 --quant exl2-4.65bpw --gpus 0
# ExLlamaV2 (TabbyAPI) serving Qwen/Qwen2-7B-Instruct (exl2-4.65bpw) on GPU 0; setting default: max_model_len 32768
# Serves an OpenAI-compatible API at http://127.0.0.1:8000/v1; extra arguments go to the engine.
set -euo pipefail
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export CUDA_VISIBLE_DEVICES=0
exec "${PYTHON:-python3}" tabbyAPI/main.py --host 127.0.0.1 --port 8000 --disable-auth true --model-dir tabbyAPI/models --model-name Qwen2-7B-Instruct-exl2-4.65bpw --backend exllamav2 --max-seq-len 32768 --max-batch-size 16 "$@"
