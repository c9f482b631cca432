"""``loadgen bench serve``: vLLM's ``bench serve`` command line, run by loadgen."""
