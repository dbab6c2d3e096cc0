"""Test doubles: the fake OpenAI-compatible server (`fake_openai.FakeOpenAI`) and a scripted
ChatLLM (`fake_chat.FakeChat`), for this project's tests and for method authors' (see stages/testing.py);
`plugin`: the kit's pytest fixtures."""
