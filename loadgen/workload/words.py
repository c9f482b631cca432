"""Words for text prompts, each one token (with its leading space) in the common BPE
vocabularies, so text prompts land on their length without a tokenizer. The tiny model's
tokenizer and the simulator use the same list."""

from __future__ import annotations

# Words that encode to one token each (with their leading space) in the GPT-2, cl100k, Llama
# and Qwen vocabularies, so text prompts land on their length without a tokenizer.
WORDS: tuple[str, ...] = tuple(
    """the of and to in is that for it with as was on be at by this had not are but from or
    have an they which one you were her all she there would their we him been has when who
    will more no if out so said what up its about into than them can only other new some
    could time these two may then do first any my now such like our over man me even most
    made after also did many before must through back years where much your way well down
    should because each just those people how too little state good very make world still
    own see men work long get here between both life being under never day same another know
    while last might us great old year off come since against go came right used take three
    """.split()
)

