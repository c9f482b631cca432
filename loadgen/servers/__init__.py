"""What loadgen runs as a server itself: the simulator, its transformers and CTranslate2 engines
and their shared OpenAI server side; and how any server process is launched and placed."""
