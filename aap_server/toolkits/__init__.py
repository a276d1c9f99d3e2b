"""What agents are built from: parts that act only through `aap_server.agent`.

- `openai_chat`: a streaming client for OpenAI-compatible Chat Completions endpoints (httpx).
- `llm`: the `llm` agent kind: a `TurnModel` on such an endpoint, and the declaration
  (`LlmAgentSpec`, a `[[agents]]` table in the config) it is built from.
- `builtin_tools`: server tools any declared agent can enable by name.
- `aom`: the built-in tools that read AOM surfaces and invoke their actions.
- `mcp_tools`: an MCP server's tools as server tools, pinned at start.
- `a2a_peers`: a remote A2A agent as a server tool the model delegates to.
- `knowledge`: folders of documents searched with BM25 (`search_knowledge`).
- `memory`: long-term memory per principal in SQLite (`remember`).

Toolkits import `aap_server.agent` (and `aap_server.ids`) and their own libraries, never the
runtime, store, guardian or api (a contract checked by `lint-imports`), so every step they
produce goes through the runtime's guardian.
"""
