/*
 * chat.js — the chat page of `kvsieve serve`.
 *
 * A conversation is a document (sent first, as the system message) and the
 * turns after it.  Every request repeats the whole conversation, as OpenAI
 * clients do, so the server's prefix cache restores the document and the
 * earlier turns and computes only the new question: each answer shows the
 * cached tokens that proves it, with the time to first token and the
 * decoding speed.  The policy and budget are per conversation and go in the
 * request's `kvsieve` object (docs/SERVER.md).
 *
 * With "Token probabilities" on, the request asks for logprobs (top 5) and
 * the answer is drawn token by token: each token shaded by its probability,
 * its alternatives on hover, and all of them in a table under the answer.
 *
 * Conversations live in this browser's localStorage only; the server keeps
 * nothing.  Text is always inserted as text (textContent), never as HTML:
 * answers and documents are untrusted.
 */
"use strict";

const STORE = "kvsieve.chat.v1";        // [conversation]
const ACTIVE = "kvsieve.chat.active";   // id of the open one
const KEY = "kvsieve.apiKey";
const DOC_PREAMBLE = "Answer the user's questions about the following document.\n\n";

const $ = (id) => document.getElementById(id);
let convs = [];
let active = null;          // the open conversation
let running = null;         // {controller, conv, msg} while an answer streams
let serverDefaults = { policy: "", budget: 0 };

/* ------------------------------------------------------------ storage -- */

function load() {
  try { convs = JSON.parse(localStorage.getItem(STORE) || "[]"); } catch (e) { convs = []; }
  if (!Array.isArray(convs)) convs = [];
  const id = localStorage.getItem(ACTIVE);
  active = convs.find((c) => c.id === id) || convs[0] || null;
  if (!active) active = newConversation();
}

function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify(convs));
    if (active) localStorage.setItem(ACTIVE, active.id);
  } catch (e) {   // a long document can pass the browser's quota (about 5 MB)
    setStatus("could not save in this browser: " + e.message, true);
  }
}

function newConversation() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 7), title: "",
              created: Date.now(), doc: "", docName: "", policy: "", budget: "",
              maxTokens: 256, temperature: 0.7, logprobs: false, messages: [] };
  convs.unshift(c);
  return c;
}

function titleOf(c) {
  if (c.title) return c.title;
  const u = c.messages.find((m) => m.role === "user");
  if (u) return u.content.slice(0, 48);
  if (c.docName) return c.docName;
  return "New conversation";
}

/* ------------------------------------------------------------- render -- */

function setStatus(text, error) {
  $("status").textContent = text || "";
  $("status").classList.toggle("error", !!error);
}

function renderList() {
  const ul = $("conv-list");
  ul.replaceChildren();
  for (const c of convs) {
    const li = document.createElement("li");
    li.dataset.id = c.id;
    if (c === active) li.classList.add("active");
    const t = document.createElement("span");
    t.className = "title";
    t.textContent = titleOf(c);
    t.title = t.textContent;
    const del = document.createElement("button");
    del.className = "delete";
    del.type = "button";
    del.title = "Delete this conversation";
    del.textContent = "\u00d7";
    del.addEventListener("click", (ev) => { ev.stopPropagation(); deleteConversation(c); });
    li.append(t, del);
    li.addEventListener("click", () => switchTo(c));
    ul.append(li);
  }
}

/* An answer as shown: without the blank lines a model often starts with
 * (the history sent back keeps the text as generated). */
function shown(text) { return text.replace(/^\s+/, ""); }

function fmt(x, digits) { return Number.isFinite(x) ? x.toFixed(digits) : "-"; }

function statsNode(s) {
  const d = document.createElement("div");
  d.className = "stats";
  const add = (label, value) => {
    const span = document.createElement("span");
    span.append(label + " ");
    const b = document.createElement("b");
    b.textContent = value;
    span.append(b);
    d.append(span);
  };
  if (s.ttft_ms != null) add("TTFT", fmt(s.ttft_ms, 0) + " ms");
  if (s.prompt_tokens != null) add("prompt", String(s.prompt_tokens));
  if (s.cached_tokens != null) add("cached", String(s.cached_tokens));
  if (s.completion_tokens != null) add("generated", String(s.completion_tokens));
  if (s.tok_s != null) add("speed", fmt(s.tok_s, 1) + " tok/s");
  add("policy", s.policy || "default");
  add("budget", s.budget ? String(s.budget) : "default");
  if (s.finish) add("finish", s.finish);
  d.dataset.cached = s.cached_tokens != null ? String(s.cached_tokens) : "";
  d.dataset.ttft = s.ttft_ms != null ? String(Math.round(s.ttft_ms)) : "";
  return d;
}

const pct = (lp) => (100 * Math.exp(lp)).toFixed(lp > -4.6 ? 1 : 2) + "%";
/* A token as shown: visible whitespace for a token that is only that. */
const tokText = (t) => (/^\s*$/.test(t) ? JSON.stringify(t).slice(1, -1) || "\u2205" : t);
const altsText = (t) => t.top.map((a) => `${tokText(a.token)}  ${pct(a.logprob)}`).join("\n");

/* The answer's text as one span per token (the leading whitespace dropped,
 * as shown() does), shaded by probability, alternatives on hover. */
function tokenSpans(text, tokens) {
  let lead = true;
  for (const t of tokens) {
    let s = t.token;
    if (lead) { s = s.replace(/^\s+/, ""); if (!s) continue; lead = false; }
    const span = document.createElement("span");
    span.className = "tok";
    span.textContent = s;
    const p = Math.exp(t.logprob);
    span.style.backgroundColor = `rgba(214, 120, 40, ${(0.45 * (1 - p)).toFixed(3)})`;
    span.dataset.p = pct(t.logprob);
    if (t.top.length) span.dataset.alts = altsText(t);
    span.title = `${pct(t.logprob)}` + (t.top.length ? "\n" + altsText(t) : "");
    text.append(span);
  }
}

/* The table under an answer: every token, its probability, the alternatives. */
function logprobTable(tokens) {
  const d = document.createElement("details");
  d.className = "lp";
  const sum = document.createElement("summary");
  const mean = tokens.reduce((a, t) => a + t.logprob, 0) / tokens.length;
  sum.textContent = `Token probabilities (${tokens.length} tokens, geometric mean p ${pct(mean)})`;
  d.append(sum);
  const wrap = document.createElement("div");
  wrap.className = "lp-wrap";
  const table = document.createElement("table");
  const head = table.insertRow();
  for (const h of ["#", "token", "p", "alternatives"]) {
    const th = document.createElement("th");
    th.textContent = h;
    head.append(th);
  }
  tokens.forEach((t, i) => {
    const r = table.insertRow();
    r.insertCell().textContent = String(i + 1);
    const c = r.insertCell();
    c.className = "mono";
    c.textContent = tokText(t.token);
    r.insertCell().textContent = pct(t.logprob);
    r.insertCell().textContent = t.top.filter((a) => a.token !== t.token).slice(0, 4)
      .map((a) => `${tokText(a.token)} ${pct(a.logprob)}`).join(", ");
  });
  wrap.append(table);
  d.append(wrap);
  return d;
}

function messageNode(m) {
  const div = document.createElement("div");
  div.className = "msg " + m.role;
  const text = document.createElement("div");
  text.className = "text";
  if (m.tokens && m.tokens.length && !(running && running.msg === m)) tokenSpans(text, m.tokens);
  else text.textContent = shown(m.content);
  div.append(text);
  if (m.error) {
    const e = document.createElement("div");
    e.className = "error";
    e.textContent = m.error;
    div.append(e);
  }
  if (m.stats) div.append(statsNode(m.stats));
  if (m.tokens && m.tokens.length && m.stats) div.append(logprobTable(m.tokens));
  return div;
}

function renderMessages() {
  const box = $("messages");
  box.replaceChildren();
  if (!active.messages.length) {
    const p = document.createElement("p");
    p.className = "empty";
    p.textContent = "Paste or upload a document above, then ask about it.";
    box.append(p);
  }
  for (const m of active.messages) {
    const node = messageNode(m);
    if (running && running.msg === m) { node.classList.add("streaming"); running.node = node; }
    box.append(node);
  }
  box.scrollTop = box.scrollHeight;
}

function renderSettings() {
  $("policy").value = active.policy || "";
  $("budget").value = active.budget || "";
  $("max-tokens").value = active.maxTokens || "";
  $("temperature").value = active.temperature ?? "";
  $("logprobs").checked = !!active.logprobs;
  $("doc-text").value = active.doc || "";
  docInfo();
}

function docInfo() {
  const n = active.doc.length;
  $("doc-info").textContent = n ? `${active.docName ? active.docName + ", " : ""}${n.toLocaleString()} characters` : "(none)";
}

function render() {
  renderList();
  renderSettings();
  renderMessages();
  const busy = !!running;
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

/* ------------------------------------------------------------ actions -- */

function switchTo(c) {
  active = c;
  save();
  render();
}

function deleteConversation(c) {
  if (running && running.conv === c) running.controller.abort();
  convs = convs.filter((x) => x !== c);
  if (active === c) active = convs[0] || newConversation();
  save();
  render();
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = localStorage.getItem(KEY);
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

async function errorText(resp) {
  try {
    const j = await resp.json();
    if (j.error) return `${resp.status} ${j.error.code || ""}: ${j.error.message}` + (j.error.param ? ` (${j.error.param})` : "");
  } catch (e) { /* not JSON */ }
  return `HTTP ${resp.status}`;
}

async function fetchModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    if (r.status === 401) { setStatus("this server needs an API key (Server, in the sidebar)", true); return; }
    if (!r.ok) { setStatus(await errorText(r), true); return; }
    const j = await r.json();
    const m = j.data && j.data[0];
    if (!m) return;
    $("model-name").textContent = m.id;
    if (m.kvsieve) {
      serverDefaults = { policy: m.kvsieve.policy || "", budget: m.kvsieve.budget || 0 };
      $("policy").placeholder = serverDefaults.policy ? serverDefaults.policy + " (default)" : "server default";
      $("budget").placeholder = serverDefaults.budget ? serverDefaults.budget + " (default)" : "all";
    }
    setStatus("");
  } catch (e) {
    setStatus("server unreachable: " + e.message, true);
  }
}

/* The request's messages: the document, then every turn that did not fail. */
function history(conv) {
  const out = [];
  if (conv.doc) out.push({ role: "system", content: DOC_PREAMBLE + conv.doc });
  for (const m of conv.messages) {
    if (m.error && !m.content) continue;
    out.push({ role: m.role, content: m.content });   // the text only: tokens stay in the page
  }
  return out;
}

function requestBody(conv) {
  const body = { messages: history(conv), stream: true, stream_options: { include_usage: true } };
  const mt = parseInt(conv.maxTokens, 10);
  if (mt > 0) body.max_tokens = mt;
  const t = parseFloat(conv.temperature);
  if (Number.isFinite(t)) body.temperature = t;
  const ext = {};
  if (conv.policy) ext.policy = conv.policy;
  const b = parseInt(conv.budget, 10);
  if (b > 0) ext.budget = b;
  if (Object.keys(ext).length) body.kvsieve = ext;
  if (conv.logprobs) { body.logprobs = true; body.top_logprobs = 5; }
  return body;
}

async function send(question) {
  if (running) return;
  const conv = active;
  conv.messages.push({ role: "user", content: question });
  const msg = { role: "assistant", content: "", stats: null };
  if (conv.logprobs) msg.tokens = [];
  conv.messages.push(msg);
  const controller = new AbortController();
  running = { controller, conv, msg, node: null };
  const stats = { policy: conv.policy || serverDefaults.policy, budget: parseInt(conv.budget, 10) || serverDefaults.budget };
  const body = requestBody(conv);
  body.messages.pop();   // the empty answer being written is not part of the request
  save();
  render();
  setStatus("waiting for the first token...");
  const t0 = performance.now();
  let tFirst = null, tLast = null, arrivals = 0;
  const update = () => {
    if (running && running.node && conv === active) {
      running.node.querySelector(".text").textContent = shown(msg.content);
      const box = $("messages");
      box.scrollTop = box.scrollHeight;
    }
  };
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal });
    if (!resp.ok) throw new Error(await errorText(resp));
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    let buf = "", done = false;
    while (!done) {
      const { value, done: end } = await reader.read();
      if (end) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {   // one Server-Sent Event per blank line
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") { done = true; break; }
          const j = JSON.parse(data);
          if (j.error) throw new Error(`${j.error.code || "error"}: ${j.error.message}`);
          const ch = j.choices && j.choices[0];
          if (ch && ch.delta && ch.delta.content) {
            if (tFirst === null) { tFirst = performance.now(); stats.ttft_ms = tFirst - t0; setStatus("streaming..."); }
            msg.content += ch.delta.content;
            tLast = performance.now();
            arrivals++;
            update();
          }
          if (ch && ch.logprobs && ch.logprobs.content && msg.tokens)
            for (const t of ch.logprobs.content)
              msg.tokens.push({ token: t.token, logprob: t.logprob,
                                top: (t.top_logprobs || []).map((a) => ({ token: a.token, logprob: a.logprob })) });
          if (ch && ch.finish_reason) stats.finish = ch.finish_reason;
          if (j.usage) {
            stats.prompt_tokens = j.usage.prompt_tokens;
            stats.completion_tokens = j.usage.completion_tokens;
            stats.cached_tokens = (j.usage.prompt_tokens_details || {}).cached_tokens ?? 0;
          }
        }
      }
    }
    setStatus("");
  } catch (e) {
    if (e.name === "AbortError") { stats.finish = "stopped"; setStatus("stopped"); }
    else { msg.error = e.message; setStatus(e.message, true); }
  }
  // Decoding speed: the tokens after the first over the time they took.  A
  // busy server or network can deliver them in a burst, which would make
  // that span meaningless: then the whole request's time is used (a lower
  // bound, prefill included).
  const n = stats.completion_tokens;
  if (n > 1 && tFirst !== null && arrivals >= 3 && tLast - tFirst >= 50 && arrivals >= n / 4)
    stats.tok_s = (n - 1) / ((tLast - tFirst) / 1000);
  else if (n > 0 && tLast !== null && tLast > t0)
    stats.tok_s = n / ((tLast - t0) / 1000);
  msg.stats = stats;
  running = null;
  save();
  if (conv === active) render(); else renderList();
}

/* --------------------------------------------------------------- wiring -- */

function bindSetting(id, field) {
  $(id).addEventListener("input", () => { active[field] = $(id).value; save(); });
}

function init() {
  load();
  $("api-key").value = localStorage.getItem(KEY) || "";
  $("api-key").addEventListener("change", () => {
    const k = $("api-key").value.trim();
    if (k) localStorage.setItem(KEY, k); else localStorage.removeItem(KEY);
    fetchModel();
  });
  bindSetting("policy", "policy");
  bindSetting("budget", "budget");
  bindSetting("max-tokens", "maxTokens");
  bindSetting("temperature", "temperature");
  $("logprobs").addEventListener("change", () => { active.logprobs = $("logprobs").checked; save(); });
  $("doc-text").addEventListener("input", () => {
    active.doc = $("doc-text").value;
    if (!active.doc) active.docName = "";
    docInfo();
    save();
    renderList();
  });
  $("doc-file").addEventListener("change", async () => {
    const f = $("doc-file").files[0];
    if (!f) return;
    active.doc = await f.text();
    active.docName = f.name;
    $("doc-text").value = active.doc;
    $("doc-file").value = "";
    docInfo();
    save();
    renderList();
  });
  $("new-conv").addEventListener("click", () => { active = newConversation(); save(); render(); $("doc-text").focus(); });
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = $("prompt").value.trim();
    if (!q || running) return;
    $("prompt").value = "";
    send(q);
  });
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); $("composer").requestSubmit(); }
  });
  $("stop").addEventListener("click", () => { if (running) running.controller.abort(); });
  render();
  fetchModel();
}

init();
