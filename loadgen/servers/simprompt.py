"""The simulator's view of a prompt: its tokenizer (a word or an id is a token, a chat message
adds its template's tokens) and its prefix cache, kept as vLLM keeps one."""

from __future__ import annotations

from collections import OrderedDict

from loadgen.data import RequestBody


def tokenize_prompt(body: RequestBody, chat: bool, image_tokens: int = 0) -> list[str | int]:
    """The simulator's tokenizer: ids are one token each, words one each, a chat message adds
    its template's tokens (the same in every request, as a real template's are), and an image
    ``image_tokens`` tokens of its own (two images' tokens differ, as their pixels do)."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list")
        tokens: list[str | int] = []
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):  # parts: text, and images by their URL
                words: list[str] = []
                for part in content:
                    if isinstance(part, dict) and part.get("type") == "text":
                        words += str(part.get("text", "")).split()
                    elif isinstance(part, dict) and part.get("type") == "image_url":
                        url = str((part.get("image_url") or {}).get("url", ""))
                        words += [f"<image:{hash(url)}:{k}>" for k in range(image_tokens)]
                    else:
                        raise ValueError("a content part must be text or image_url")
                content = " ".join(words)
            calls = m.get("tool_calls") if isinstance(m, dict) else None
            if content is None and calls:
                content = ""  # an answer that only called tools
            if not isinstance(content, str):
                raise ValueError("each message needs a string 'content'")
            for call in calls if isinstance(calls, list) else ():  # a call's name and its arguments' words
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    content += f" {function.get('name', '')} {function.get('arguments', '')}"
            role = str(m.get("role", "user"))
            tokens += ["<|im_start|>", role, "\n", *content.split(), "<|im_end|>", "\n"]
        return [*tokens, "<|im_start|>", "assistant", "\n"]
    prompt = body.get("prompt")
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) and prompt:
        return list(prompt)
    if isinstance(prompt, str):
        return list(prompt.split())
    raise ValueError("'prompt' must be a string or a non-empty list of token ids")


class PrefixCache:
    """A prefix cache as vLLM keeps one: prompts in blocks of ``BLOCK`` tokens, each block known
    by the hash of its tokens and of every block before it; a request's full blocks already
    cached are hits. Counted in tokens, as vLLM's ``prefix_cache_queries`` / ``_hits``."""

    BLOCK = 16
    CAPACITY = 1 << 16  # blocks kept, least recently used dropped first

    def __init__(self) -> None:
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.queries = 0
        self.hits = 0

    def lookup(self, tokens: list[str | int]) -> int:
        """Record a prompt: returns how many of its tokens were cached, and caches its blocks."""
        self.queries += len(tokens)
        h, hit, missed = 0, 0, False
        for start in range(0, len(tokens) - self.BLOCK + 1, self.BLOCK):
            h = hash((h, tuple(tokens[start:start + self.BLOCK])))
            if not missed and h in self.blocks:
                hit += self.BLOCK
                self.blocks.move_to_end(h)
                continue
            missed = True
            self.blocks[h] = None
            if len(self.blocks) > self.CAPACITY:
                self.blocks.popitem(last=False)
        self.hits += hit
        return hit

    def reset(self) -> None:
        self.blocks.clear()
