// The aap-server console: a plain client of this server's AAP API (no framework, no build).
// Everything shown is built with DOM nodes and text nodes; nothing is ever parsed as HTML,
// so model output such as `<img onerror=…>` shows as the text it is.
"use strict";

const BASE = document.documentElement.dataset.base || "";
const KEY_STORAGE = "aap-console-api-key";
const AUDIT_MAX_PAGES = 50; // the side panel reads at most this many audit pages

const $ = (id) => document.getElementById(id);

const state = {
  agents: [], // GET /meta's agents
  session: null, // the open session (SessionInfo)
  agent: null, // the open session's AgentInfo
  sessionsNext: null, // the cursor of the next sessions page
  calls: new Map(), // toolCallId -> the open turn's tool call card
  turnBlock: null, // the console's block of the current turn
  auditTurns: new Set(), // turn ids whose verdicts are already shown beside a turn
  busy: false,
};

// --- DOM helpers ---------------------------------------------------------------------

// el("div", {class: "x", onclick: f}, "text", child): strings become text nodes.
function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === false || value === null || value === undefined) continue;
    if (name === "class") node.className = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  node.append(...children.flat().filter((child) => child !== null && child !== undefined));
  return node;
}

function notice(message) {
  const box = $("notice");
  box.textContent = message || "";
  box.hidden = !message;
}

function json(value) {
  return JSON.stringify(value, null, 2);
}

// --- the API -----------------------------------------------------------------------------

class ApiError extends Error {}

async function api(method, path, body) {
  const headers = { Accept: "application/json, text/event-stream" };
  const key = sessionStorage.getItem(KEY_STORAGE);
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(BASE + path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (!response.ok) {
    let message = `${method} ${path}: HTTP ${response.status}`;
    try {
      const { error } = await response.json();
      message = `${message} ${error.code}: ${error.message}`;
    } catch {
      // not our JSON error: the status says enough
    }
    throw new ApiError(message);
  }
  return response;
}

async function apiJson(method, path, body) {
  const response = await api(method, path, body);
  return response.status === 204 ? null : response.json();
}

// Server-sent events from a fetch body (EventSource cannot POST). Yields {event, data}.
async function* readSse(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = "";
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      // A chunk may end between the "\r" and "\n" of one line break: keep that "\r".
      const cut = buffer.endsWith("\r") ? buffer.length - 1 : buffer.length;
      const lines = buffer.slice(0, cut).split(/\r\n|\r|\n/);
      buffer = lines.pop() + buffer.slice(cut);
      for (const line of lines) {
        if (line === "") {
          if (data.length) yield { event: event || "message", data: data.join("\n") };
          event = "";
          data = [];
        } else if (!line.startsWith(":")) {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? "" : line.slice(colon + 1);
          if (value.startsWith(" ")) value = value.slice(1);
          if (field === "event") event = value;
          else if (field === "data") data.push(value);
        }
      }
    }
  } finally {
    reader.releaseLock();
  }
}

// --- the API key -------------------------------------------------------------------------

function setupKey() {
  $("api-key").value = sessionStorage.getItem(KEY_STORAGE) || "";
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (key) sessionStorage.setItem(KEY_STORAGE, key);
    else sessionStorage.removeItem(KEY_STORAGE);
    closeSession("Pick an agent and create a session, or open one from the list.");
    start();
  });
  $("forget-key").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_STORAGE);
    $("api-key").value = "";
    notice("Key forgotten.");
  });
}

// --- agents and new sessions -------------------------------------------------------------

async function loadMeta() {
  const meta = await apiJson("GET", "/meta");
  state.agents = meta.agents;
  const select = $("agent");
  select.replaceChildren(
    ...meta.agents.map((agent) =>
      el("option", { value: agent.name }, agent.title ? `${agent.title} (${agent.name})` : agent.name),
    ),
  );
  showAgentForm();
}

function agentNamed(name) {
  return state.agents.find((agent) => agent.name === name) || null;
}

function optionInput(option) {
  const id = `option-${option.name}`;
  let input;
  if (option.type === "select") {
    input = el("select", { id }, option.options.map((choice) => el("option", { value: choice }, choice)));
  } else {
    // Secret options are typed like passwords: never shown on screen.
    input = el("input", { id, type: option.type === "secret" ? "password" : "text", autocomplete: "off" });
  }
  input.value = option.default;
  input.dataset.option = option.name;
  input.dataset.default = option.default;
  return el(
    "div",
    { class: "field" },
    el("label", { for: id, title: option.description || "" }, option.title || option.name),
    input,
    option.description ? el("small", { class: "muted" }, option.description) : null,
  );
}

function toolRow(tool) {
  return el(
    "div",
    { class: "tool-row", title: tool.description || "" },
    el("label", {}, el("input", { type: "checkbox", checked: true, "data-tool": tool.name }), ` ${tool.name}`),
    el("label", { class: "muted" }, el("input", { type: "checkbox", "data-trust": tool.name }), " trusted"),
  );
}

function showAgentForm() {
  const agent = agentNamed($("agent").value);
  $("agent-description").textContent = agent?.description || "";
  const options = agent?.options || [];
  const tools = agent?.tools || [];
  $("agent-options").replaceChildren(el("legend", {}, "Options"), ...options.map(optionInput));
  $("agent-options").hidden = !options.length;
  $("agent-tools").replaceChildren(el("legend", {}, "Server tools"), ...tools.map(toolRow));
  $("agent-tools").hidden = !tools.length;
  $("client-tools").disabled = !agent?.capabilities?.application?.tools;
}

function readNewSessionForm() {
  const name = $("agent").value;
  const options = {}; // only what differs from the defaults (the rest goes without saying)
  for (const input of $("agent-options").querySelectorAll("[data-option]")) {
    if (input.value !== input.dataset.default) options[input.dataset.option] = input.value;
  }
  const tools = [];
  for (const box of $("agent-tools").querySelectorAll("[data-tool]")) {
    if (!box.checked) continue;
    const trust = $("agent-tools").querySelector(`[data-trust="${CSS.escape(box.dataset.tool)}"]`);
    tools.push({ name: box.dataset.tool, trust: trust.checked });
  }
  const request = { agent: { name, options, tools } };
  const clientTools = $("client-tools").value.trim();
  if (clientTools && !$("client-tools").disabled) {
    try {
      request.tools = JSON.parse(clientTools);
    } catch (error) {
      throw new ApiError(`Client tools: not valid JSON (${error.message})`);
    }
  }
  return request;
}

async function createSession(event) {
  event.preventDefault();
  await guarded(async () => {
    const request = readNewSessionForm();
    const { sessionId } = await apiJson("POST", "/sessions", request);
    await openSession(sessionId);
    await loadSessions();
  });
}

// --- the session list --------------------------------------------------------------------

async function loadSessions(more = false) {
  const path = more && state.sessionsNext ? `/sessions?after=${encodeURIComponent(state.sessionsNext)}` : "/sessions";
  const page = await apiJson("GET", path);
  const items = page.sessions.map((session) =>
    el(
      "li",
      { "data-session": session.sessionId, class: session.sessionId === state.session?.sessionId ? "open" : null },
      el(
        "button",
        { type: "button", class: "link", onclick: () => guarded(() => openSession(session.sessionId)) },
        el("strong", {}, session.agent.name),
        " ",
        el("code", {}, session.sessionId),
      ),
    ),
  );
  if (more) $("sessions").append(...items);
  else $("sessions").replaceChildren(...items);
  state.sessionsNext = page.next || null;
  $("more-sessions").hidden = !state.sessionsNext;
}

async function openSession(sessionId) {
  const session = await apiJson("GET", `/sessions/${encodeURIComponent(sessionId)}`);
  state.session = session;
  state.agent = agentNamed(session.agent.name);
  state.calls = new Map();
  state.turnBlock = null;
  state.auditTurns = new Set();
  for (const item of $("sessions").children) item.classList.toggle("open", item.dataset.session === sessionId);

  const options = Object.entries(session.agent.options || {}).map(([name, value]) => `${name}=${value}`);
  $("session-title").replaceChildren(
    el(
      "span",
      {},
      el("strong", {}, session.agent.name),
      " ",
      el("code", {}, session.sessionId),
      options.length ? el("span", { class: "muted" }, ` · ${options.join(", ")}`) : null,
    ),
  );
  const history = state.agent?.capabilities?.history || {};
  const kinds = ["full", "compacted"].filter((kind) => kind in history);
  $("history-type").replaceChildren(...kinds.map((kind) => el("option", { value: kind }, kind)));
  $("history-type").disabled = !kinds.length;
  const streams = Object.keys(state.agent?.capabilities?.stream || { none: {} });
  const modes = ["delta", "message", "none"].filter((mode) => streams.includes(mode));
  $("stream-mode").replaceChildren(...modes.map((mode) => el("option", { value: mode }, mode)));
  $("session-bar").hidden = false;
  $("composer").hidden = false;
  await showHistory();
  await refreshVerdicts();
}

async function deleteSession() {
  const session = state.session;
  if (!session || !confirm(`Delete session ${session.sessionId} and all its history?`)) return;
  await guarded(async () => {
    await apiJson("DELETE", `/sessions/${encodeURIComponent(session.sessionId)}`);
    closeSession(`Deleted ${session.sessionId}.`);
    await loadSessions();
  });
}

function closeSession(message) {
  state.session = null;
  state.calls = new Map();
  $("session-bar").hidden = true;
  $("composer").hidden = true;
  $("transcript").replaceChildren(el("p", { class: "muted empty" }, message));
  $("verdicts").replaceChildren(el("p", { class: "muted" }, "The audit trail of the open session."));
}

// --- the transcript ----------------------------------------------------------------------

// One turn (or a stretch of history) in the transcript; takes AAP events, in any mode.
// Each assistant message shows its thinking above its text, in whatever order they stream.
class TurnBlock {
  constructor(label) {
    this.node = el("section", { class: "turn" });
    if (label) this.node.append(el("div", { class: "turn-label muted" }, label));
    this.reply = null; // the assistant message being written: {node, thinking, text}
    this.counts = { text_delta: 0, thinking_delta: 0 };
    $("transcript").append(this.node);
  }

  user(content) {
    this.reply = null;
    this.node.append(el("div", { class: "msg user" }, el("span", { class: "who" }, "You"), contentView(content)));
    this.scroll();
  }

  event(name, data) {
    if (name in this.counts) this.counts[name] += 1;
    switch (name) {
      case "text_delta":
        this.write("text", data.delta, false);
        break;
      case "thinking_delta":
        this.write("thinking", data.delta, false);
        break;
      case "text":
        this.write("text", data.text, true);
        break;
      case "thinking":
        this.write("thinking", data.thinking, true);
        break;
      case "tool_call":
        this.reply = null;
        this.node.append(toolCallCard(data));
        break;
      case "tool_result":
        this.reply = null;
        showToolResult(data.toolCallId, data.content, this.node);
        break;
      default:
        break; // turn_start, turn_stop: the caller handles them; unknown events are ignored
    }
    this.scroll();
  }

  // Append to the reply's text or thinking (a Text node: never parsed as HTML). A whole
  // `text`/`thinking` (message mode) starts a new reply when this one already has that part.
  write(part, chunk, whole) {
    if (!this.reply || (whole && this.reply[part])) {
      this.reply = { node: el("div", { class: "reply" }), text: null, thinking: null };
      this.node.append(this.reply.node);
    }
    if (!this.reply[part]) {
      const textNode = document.createTextNode("");
      this.reply[part] = textNode;
      if (part === "thinking") {
        this.reply.node.prepend(el("details", { class: "thinking", open: true }, el("summary", {}, "Thinking"), el("div", { class: "text" }, textNode)));
      } else {
        this.reply.node.append(el("div", { class: "msg assistant" }, el("span", { class: "who" }, "Agent"), el("div", { class: "text" }, textNode)));
      }
    }
    this.reply[part].appendData(chunk);
  }

  // The events a stored message stands for (history and `stream: "none"` answers).
  message(message) {
    this.reply = null;
    if (message.role === "user") this.user(message.content);
    else if (message.role === "system") this.node.append(el("div", { class: "msg system" }, el("span", { class: "who" }, "System"), message.content));
    else if (message.role === "tool") this.event("tool_result", message);
    else if (message.role === "assistant") {
      if (typeof message.content === "string") this.event("text", { text: message.content });
      else for (const block of message.content) {
        if (block.type === "text") this.event("text", { text: block.text });
        else if (block.type === "thinking") this.event("thinking", { thinking: block.thinking });
        else if (block.type === "tool_use") this.event("tool_call", block);
        else if (block.type === "image") this.node.append(el("div", { class: "msg assistant" }, `[image] ${block.url}`));
      }
    }
  }

  footer(parts, stopReason) {
    this.node.append(el("div", { class: `turn-footer stop-${stopReason}` }, parts.join(" · ")));
    this.scroll();
  }

  scroll() {
    $("transcript").scrollTop = $("transcript").scrollHeight;
  }
}

function contentView(content) {
  if (typeof content === "string") return el("div", { class: "text" }, content);
  return el(
    "div",
    { class: "text" },
    content.map((block) => {
      if (block.type === "text") return el("div", {}, block.text);
      if (block.type === "image") return el("div", { class: "muted" }, `[image] ${block.url}`);
      return el("pre", {}, json(block));
    }),
  );
}

function toolCallCard(call) {
  const card = el(
    "div",
    { class: "tool-call", "data-call": call.toolCallId },
    el("div", { class: "tool-head" }, "Tool call ", el("strong", {}, call.name), " ", el("code", { class: "muted" }, call.toolCallId)),
    el("pre", { class: "tool-input" }, json(call.input)),
  );
  state.calls.set(call.toolCallId, { call, card, result: null, answer: null, sent: false });
  return card;
}

function showToolResult(toolCallId, content, fallbackParent) {
  const entry = state.calls.get(toolCallId);
  const text = typeof content === "string" ? content : content.map((block) => block.text ?? json(block)).join("\n");
  const view = el("div", { class: "tool-result" }, el("span", { class: "who" }, "Result"), el("pre", {}, text));
  if (entry) {
    entry.result = content;
    entry.card.querySelector(".answer")?.remove();
    entry.card.append(view);
  } else {
    fallbackParent.append(el("div", { class: "tool-call" }, `Result of ${toolCallId}`, view));
  }
}

// After `stopReason: tool_use`: each call without a result needs the user: a permission for
// a server tool, a result for a client tool. All answers go back in one turn.
function askForAnswers() {
  const clientTools = new Set((state.session.tools || []).map((tool) => tool.name));
  const open = [...state.calls.values()].filter((entry) => entry.result === null && entry.answer === null);
  for (const entry of open) {
    const id = entry.call.toolCallId;
    if (clientTools.has(entry.call.name)) {
      const result = el("textarea", { rows: 2, class: "client-result", placeholder: "The tool's result" });
      entry.card.append(
        el(
          "form",
          { class: "answer client", onsubmit: (event) => { event.preventDefault(); answer(entry, { role: "tool", toolCallId: id, content: result.value }, `Result sent: ${result.value}`); } },
          el("div", { class: "muted" }, "A client tool: run it and enter its result."),
          result,
          el("button", { type: "submit" }, "Send result"),
        ),
      );
    } else {
      const reason = el("input", { type: "text", class: "deny-reason", placeholder: "Reason (optional)" });
      entry.card.append(
        el(
          "div",
          { class: "answer permission" },
          el("div", {}, "The agent asks permission to run this tool."),
          el("button", { type: "button", class: "grant", onclick: () => answer(entry, { role: "tool_permission", toolCallId: id, granted: true }, "Granted") }, "Grant"),
          reason,
          el("button", {
            type: "button",
            class: "deny danger",
            onclick: () => {
              const message = { role: "tool_permission", toolCallId: id, granted: false };
              if (reason.value.trim()) message.reason = reason.value.trim();
              answer(entry, message, reason.value.trim() ? `Denied: ${reason.value.trim()}` : "Denied");
            },
          }, "Deny"),
        ),
      );
    }
  }
}

function answer(entry, message, summary) {
  entry.answer = message;
  entry.card.querySelector(".answer")?.replaceWith(el("div", { class: "answer answered muted" }, summary));
  const waiting = [...state.calls.values()].filter((other) => other.result === null && other.answer === null);
  if (waiting.length) return;
  // Answered calls stay in the map until their result arrives (it goes under the call's card).
  const answers = [...state.calls.values()].filter((other) => other.answer !== null && !other.sent);
  for (const other of answers) other.sent = true;
  runTurn(answers.map((other) => other.answer));
}

async function showHistory() {
  const transcript = $("transcript");
  transcript.replaceChildren();
  const kind = $("history-type").value;
  if (!kind) {
    transcript.append(el("p", { class: "muted empty" }, "This agent keeps no history to show."));
    return;
  }
  const { history } = await apiJson("GET", `/sessions/${encodeURIComponent(state.session.sessionId)}/history?type=${kind}`);
  const messages = history[kind] || [];
  if (!messages.length) {
    transcript.append(el("p", { class: "muted empty" }, "No messages yet."));
    return;
  }
  const block = new TurnBlock(`${kind} history`);
  for (const message of messages) block.message(message);
  // A turn that stopped for tool_use can be answered after a reload (AAP tool call resumption).
  if (kind === "full") askForAnswers();
}

// --- turns -------------------------------------------------------------------------------

async function sendMessage(event) {
  event.preventDefault();
  const text = $("message").value;
  if (!text.trim() || state.busy) return;
  $("message").value = "";
  await runTurn([{ role: "user", content: text }]);
}

async function runTurn(messages) {
  const session = state.session;
  const mode = $("stream-mode").value || "none";
  setBusy(true);
  $("transcript").querySelector(".empty")?.remove();
  const block = new TurnBlock(null);
  state.turnBlock = block;
  for (const message of messages) if (message.role === "user") block.user(message.content);
  let stopReason = "?";
  try {
    const path = `/sessions/${encodeURIComponent(session.sessionId)}/turns`;
    const response = await api("POST", path, { messages, stream: mode });
    if (mode === "none") {
      const body = await response.json();
      for (const message of body.messages) block.message(message);
      stopReason = body.stopReason;
    } else {
      for await (const { event, data } of readSse(response.body)) {
        const payload = JSON.parse(data);
        if (event === "turn_stop") stopReason = payload.stopReason;
        else block.event(event, payload);
      }
    }
    const parts = [`stream: ${mode}`];
    if (mode === "delta") parts.push(plural(block.counts.text_delta, "text delta"), plural(block.counts.thinking_delta, "thinking delta"));
    parts.push(`stop: ${stopReason}`);
    block.footer(parts, stopReason);
    if (stopReason === "tool_use") askForAnswers();
  } catch (error) {
    block.footer([`failed: ${error.message}`], "failed");
    notice(error.message);
  } finally {
    setBusy(false);
  }
  if (state.session === session) await guarded(refreshVerdicts);
}

function setBusy(busy) {
  state.busy = busy;
  $("send").disabled = busy;
  $("composer").classList.toggle("busy", busy);
}

// --- guardian verdicts (the audit trail) -----------------------------------------------

async function loadAudit(sessionId) {
  const records = [];
  let after = null;
  for (let page = 0; page < AUDIT_MAX_PAGES; page += 1) {
    const query = after ? `?after=${encodeURIComponent(after)}` : "";
    const body = await apiJson("GET", `/sessions/${encodeURIComponent(sessionId)}/audit${query}`);
    records.push(...body.records);
    if (!body.next) break;
    after = body.next;
  }
  return records;
}

function verdictRow(record) {
  return el(
    "tr",
    { class: `verdict ${record.decision}` },
    el("td", {}, record.method.replace(/^steps\//, "")),
    el("td", {}, el("span", { class: `badge ${record.decision}` }, record.decision)),
    el("td", {}, record.ruleId || ""),
    el("td", {}, record.reasonCodes.join(", ")),
  );
}

function verdictTable(records) {
  return el(
    "table",
    { class: "verdict-table" },
    el("thead", {}, el("tr", {}, el("th", {}, "step"), el("th", {}, "decision"), el("th", {}, "rule"), el("th", {}, "reason"))),
    el("tbody", {}, records.map(verdictRow)),
  );
}

async function refreshVerdicts() {
  const session = state.session;
  if (!session) return;
  const records = await loadAudit(session.sessionId);
  if (state.session !== session) return;
  const turns = new Map();
  for (const record of records) {
    if (!turns.has(record.turnId)) turns.set(record.turnId, []);
    turns.get(record.turnId).push(record);
  }
  // Beside the messages: the turn just run gets the verdicts of the turn ids new since.
  const fresh = [...turns.keys()].filter((turnId) => !state.auditTurns.has(turnId));
  if (state.turnBlock && fresh.length) {
    const newRecords = fresh.flatMap((turnId) => turns.get(turnId));
    const denied = newRecords.filter((record) => record.decision !== "allow");
    state.turnBlock.node.append(
      el(
        "details",
        { class: `turn-verdicts${denied.length ? " has-denials" : ""}`, open: denied.length > 0 },
        el("summary", {}, `Guardian: ${summarize(newRecords)}`),
        verdictTable(newRecords),
      ),
    );
  }
  for (const turnId of turns.keys()) state.auditTurns.add(turnId);
  const panel = [...turns].reverse().map(([turnId, entries]) =>
    el("section", { class: "audit-turn" }, el("h3", {}, el("code", {}, turnId), el("span", { class: "muted" }, ` ${summarize(entries)}`)), verdictTable(entries)),
  );
  $("verdicts").replaceChildren(...(panel.length ? panel : [el("p", { class: "muted" }, "No verdicts yet.")]));
}

function plural(count, noun) {
  return `${count} ${noun}${count === 1 ? "" : "s"}`;
}

function summarize(records) {
  const counts = {};
  for (const record of records) counts[record.decision] = (counts[record.decision] || 0) + 1;
  return Object.entries(counts).map(([decision, count]) => `${count} ${decision}`).join(", ");
}

// --- start -------------------------------------------------------------------------------

async function guarded(action) {
  try {
    notice("");
    await action();
  } catch (error) {
    notice(error instanceof ApiError ? error.message : `Error: ${error.message}`);
  }
}

function start() {
  return guarded(async () => {
    await loadMeta();
    await loadSessions();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  setupKey();
  $("agent").addEventListener("change", showAgentForm);
  $("new-session").addEventListener("submit", createSession);
  $("refresh-sessions").addEventListener("click", () => guarded(() => loadSessions()));
  $("more-sessions").addEventListener("click", () => guarded(() => loadSessions(true)));
  $("delete-session").addEventListener("click", deleteSession);
  $("history-type").addEventListener("change", () => guarded(showHistory));
  $("composer").addEventListener("submit", sendMessage);
  $("message").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("composer").requestSubmit();
  });
  start();
});
