"""LD-Agent: event memory with time decay and topic overlap, and persona banks per speaker (the
paper's modules are mapped in `method.py`; its prompts in `prompts.py`)."""

from stages.methods.ld_agent.method import EVENTS, LDAgent, LDAgentSettings, PERSONAS, RETRIEVAL

__all__ = ["EVENTS", "LDAgent", "LDAgentSettings", "PERSONAS", "RETRIEVAL"]
