"""The baselines the papers compare against, one module per family: whole or partial history
(`history`), session memories (`memory_baselines`), the corpus's gold memory (`gold_memory`), the
real next turn (`golden`), MemoChat (`memochat`), COMEDY (`comedy`), a mem0-style store
(`mem0_style`) and LD-Agent's "ChatGPT" row (`chatgpt`). Imports nothing on purpose: the registry
(`stages.methods`) imports each module."""
