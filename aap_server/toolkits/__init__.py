"""What agents are built from: parts that act only through `aap_server.agent`.

- `openai_chat`: a streaming client for OpenAI-compatible Chat Completions endpoints (httpx).
- `llm`: the `llm` agent kind: a `TurnModel` on such an endpoint, and the declaration
  (`LlmAgentSpec`, a `[[agents]]` table in the config) it is built from.
- `builtin_tools`: server tools any declared agent can enable by name.

Toolkits import only `aap_server.agent` and their own libraries (a contract checked by
`lint-imports`), so every step they produce goes through the runtime's guardian.
"""
