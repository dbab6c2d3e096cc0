"""Memory-method algorithms: pure async functions over plain records, with the LLM injected."""
