"""servers/openai"""
