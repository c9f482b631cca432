"""The server side of the OpenAI API that loadgen's own servers share (the simulator and the
transformers engine): routing, response and chunk bodies, stream options, SSE framing and
``/metrics`` through prometheus_client."""
