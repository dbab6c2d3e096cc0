"""A scripted stand-in for the ChatLLM protocol, for algorithm tests.

It behaves like the real client where algorithms can tell the difference: the answer text is parsed
into `schema`, passed to `validate`, and an invalid answer is re-asked (the bad answer and the error
are appended to the conversation, so a responder can react), up to `max_attempts` answers in all,
after which LLMError(reason, raw) is raised.

Answers come from `answers` (consumed in call order) or from `responder(messages, schema)`. An answer
may be a str (raw text), a dict / list / pydantic model (sent as JSON), an LLMError instance (raised
as is, like a transport failure) or a callable taking (messages, schema) and returning any of these.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from pipeline.llm.types import LLMError, LLMResult, Messages

Answer = Any


class FakeChat:
    def __init__(
        self,
        answers: list[Answer] | None = None,
        *,
        responder: Callable[[Messages, type[BaseModel] | None], Answer] | None = None,
        max_attempts: int = 2,
    ) -> None:
        if answers is None and responder is None:
            raise ValueError("give scripted answers or a responder")
        self.answers = list(answers or [])
        self.responder = responder
        self.max_attempts = max_attempts
        self.calls: list[dict[str, Any]] = []  # one per chat() call: messages, schema, attempts, errors

    @property
    def n_requests(self) -> int:
        """Answers served, re-asks included."""
        return sum(c["attempts"] for c in self.calls)

    def _next(self, messages: Messages, schema: type[BaseModel] | None) -> Answer:
        if self.responder is not None:
            ans = self.responder(messages, schema)
        elif self.answers:
            ans = self.answers.pop(0)
        else:
            raise AssertionError("FakeChat ran out of scripted answers")
        if callable(ans) and not isinstance(ans, (BaseModel, LLMError)):
            ans = ans(messages, schema)
        return ans

    async def chat(
        self,
        messages: Messages,
        *,
        schema: type[BaseModel] | None = None,
        validate: Callable[[Any], None] | None = None,
        sample: int = 0,
        **params: Any,
    ) -> LLMResult:
        convo = [dict(m) for m in messages]
        call: dict[str, Any] = {"messages": convo, "schema": schema, "params": params, "attempts": 0, "errors": []}
        self.calls.append(call)
        raw: str | None = None
        for _ in range(self.max_attempts):
            ans = self._next(convo, schema)
            call["attempts"] += 1
            if isinstance(ans, LLMError):
                raise ans
            if isinstance(ans, BaseModel):
                raw = ans.model_dump_json()
            elif isinstance(ans, (dict, list)):
                raw = json.dumps(ans)
            else:
                raw = str(ans)
            if schema is None:
                return LLMResult(text=raw, model="fake")
            try:
                parsed = schema.model_validate_json(raw)
                if validate is not None:
                    validate(parsed)
            except (ValidationError, ValueError) as e:
                call["errors"].append(str(e))
                convo = convo + [{"role": "assistant", "content": raw},
                                 {"role": "user", "content": f"That answer was invalid: {e}. Try again."}]
                continue
            return LLMResult(text=raw, parsed=parsed, model="fake")
        raise LLMError(f"invalid output after {self.max_attempts} attempts: {call['errors'][-1]}", raw)
