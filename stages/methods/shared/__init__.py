"""What methods share: dialogue formatting (`dialogue`), the response frames (`response`,
`memory_response`) and per-session memories (`session_memories`). Imports nothing on purpose:
each method imports the helper modules it uses, so its fingerprint follows only those."""
