#!/usr/bin/env bash
# loadgen serve qwen2-7b --quant gptq-int4 --backend transformers --gpus 0
# HF Transformers (loadgen's transformers engine) serving Qwen/Qwen2-7B-Instruct-GPTQ-Int4 (gptq-int4) on GPU 0; setting default: max_model_len 32768
# Serves an OpenAI-compatible API at http://127.0.0.1:8000/v1; extra arguments go to the engine.
set -euo pipefail
export CUDA_DEVICE_ORDER=PCI_BUS_ID
export CUDA_VISIBLE_DEVICES=0
exec "${PYTHON:-python3}" -m loadgen.servers.hfserve --model Qwen/Qwen2-7B-Instruct-GPTQ-Int4 --served-model-name qwen2-7b --host 127.0.0.1 --port 8000 --device cuda --attn-implementation sdpa --max-model-len 32768 "$@"
