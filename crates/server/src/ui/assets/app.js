// corral's dashboard: one small module, no build step, no dependencies.
// The server renders each page's shell (and HTML fragments under
// /ui/part/); this fills them in and keeps them live. Writes carry the
// session's CSRF token in the x-corral-csrf header.

const main = document.querySelector("main");
const page = main ? main.dataset.page : "";
const csrfMeta = document.querySelector('meta[name="corral-csrf"]');
const csrf = csrfMeta ? csrfMeta.content : "";

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  for (const child of children) node.append(child);
  return node;
}

async function write(method, url, body, contentType = "application/json") {
  const response = await fetch(url, {
    method,
    headers: { "content-type": contentType, "x-corral-csrf": csrf },
    body,
    credentials: "same-origin",
  });
  return response;
}

async function errorText(response) {
  const text = await response.text();
  try {
    return JSON.parse(text).message || text;
  } catch {
    return text;
  }
}

const signOut = document.getElementById("sign-out");
if (signOut) {
  signOut.addEventListener("click", async () => {
    await write("POST", "/ui/logout", "");
    location.href = "/ui/login";
  });
}

// ---- Overview: tables fed by one server-sent-event stream.
// A `gone` event (a watch fell behind the server's window) starts over
// with a fresh list; EventSource itself reconnects after a network error.
function overview() {
  const namespace = main.dataset.namespace;
  const tables = document.getElementById("tables");
  const state = document.getElementById("live-state");
  const bodies = new Map();
  const source = new EventSource("/ui/live?namespace=" + encodeURIComponent(namespace));
  source.addEventListener("gone", () => {
    source.close();
    overview();
  });
  source.addEventListener("open", () => {
    state.textContent = "live";
    state.dataset.state = "live";
  });
  source.addEventListener("error", () => {
    state.textContent = "reconnecting…";
    state.dataset.state = "reconnecting";
  });
  source.addEventListener("kinds", (event) => {
    tables.replaceChildren();
    bodies.clear();
    for (const kind of JSON.parse(event.data)) {
      const head = el("tr", {}, ...kind.headers.map((h) => el("th", {}, h)));
      const body = el("tbody");
      bodies.set(kind.plural, body);
      tables.append(
        el("section", { id: "kind-" + kind.plural },
          el("h2", {}, kind.title),
          el("table", { class: "objects", "data-plural": kind.plural }, el("thead", {}, head), body)),
      );
    }
  });
  source.addEventListener("row", (event) => {
    const row = JSON.parse(event.data);
    const body = bodies.get(row.plural);
    if (!body) return;
    const id = "row-" + row.plural + "-" + row.name;
    const old = document.getElementById(id);
    if (row.deleted) {
      if (old) old.remove();
      return;
    }
    const query = row.namespace ? "?namespace=" + encodeURIComponent(row.namespace) : "";
    const link = el("a", { href: "/ui/objects/" + row.plural + "/" + encodeURIComponent(row.name) + query }, row.cells[0]);
    const tr = el("tr", { id, "data-name": row.name }, el("td", {}, link),
      ...row.cells.slice(1).map((cell) => el("td", {}, cell)));
    if (old) old.replaceWith(tr);
    else body.append(tr);
  });
  source.addEventListener("error", (event) => {
    if (!event.data) return;
    const problem = JSON.parse(event.data);
    const section = document.getElementById("kind-" + problem.plural);
    const note = el("p", { class: "error" }, problem.message);
    if (section) section.append(note);
    else tables.append(note);
  });
}

// ---- Object page: fragments from /ui/part, diff, rollback, logs, console.
function objectPage() {
  const { plural, namespace, name } = main.dataset;
  const base = (part) => "/ui/part/" + part + "/" + plural + "/" + encodeURIComponent(name) +
    "?namespace=" + encodeURIComponent(namespace);
  async function load(part, target, extra = "") {
    const response = await fetch(base(part) + extra, { credentials: "same-origin" });
    target.innerHTML = await response.text();
    target.dataset.loaded = response.ok ? "ok" : "error";
  }
  const parts = document.querySelectorAll(".part");
  for (const target of parts) load(target.dataset.part, target);
  const history = document.querySelector('[data-part="history"]');
  watchObject(plural, namespace, name, () => {
    for (const target of parts) load(target.dataset.part, target);
  });

  document.getElementById("diff-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const from = document.getElementById("diff-from").value.trim();
    const to = document.getElementById("diff-to").value.trim();
    const extra = "&from=" + encodeURIComponent(from) + (to ? "&to=" + encodeURIComponent(to) : "");
    load("diff", document.getElementById("diff"), extra);
  });

  document.getElementById("rollback-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const result = document.getElementById("rollback-result");
    const to = Number(document.getElementById("rollback-to").value.trim());
    const message = document.getElementById("rollback-message").value.trim();
    const path = (namespace ? "/v1/namespaces/" + encodeURIComponent(namespace) : "/v1") +
      "/" + plural + "/" + encodeURIComponent(name) + "/rollback";
    const response = await write("POST", path, JSON.stringify({ to, message }));
    if (response.ok) {
      const object = await response.json();
      result.textContent = "rolled back to revision " + to + ": now revision " + object.metadata.revision;
      result.className = "ok";
      await load("history", history);
      for (const part of ["why", "object"]) load(part, document.querySelector('[data-part="' + part + '"]'));
    } else {
      result.textContent = await errorText(response);
      result.className = "error";
    }
  });

  const objectPath = (namespace ? "/v1/namespaces/" + encodeURIComponent(namespace) : "/v1") +
    "/" + plural + "/" + encodeURIComponent(name);
  for (const action of ["stop", "start", "restart", "reset"]) {
    const button = document.getElementById("vm-" + action);
    if (button) button.addEventListener("click", () => power(objectPath, action));
  }
  document.getElementById("delete-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const result = document.getElementById("delete-result");
    const message = document.getElementById("delete-message").value.trim();
    const response = await write("DELETE", objectPath + "?message=" + encodeURIComponent(message));
    if (response.ok) {
      const object = await response.json();
      result.textContent = response.status === 202
        ? "deleting: its stop workflow " + object.metadata.deleting.workflow + " runs"
        : "deleted";
      result.className = "ok";
    } else {
      result.textContent = await errorText(response);
      result.className = "error";
    }
  });

  const follow = document.getElementById("logs-follow");
  if (follow) follow.addEventListener("click", () => streamLogs(namespace, name));
  const consoleButton = document.getElementById("console-open");
  if (consoleButton) consoleButton.addEventListener("click", () => openConsole(namespace, name));
}

// A VM's power action (`corral vm stop|start|restart|reset`): a new
// revision of its spec — `running` for stop and start, `power` for
// restart and reset — recorded as the signed-in person. A stop of a
// stopped VM (a start of a running one) writes nothing and says so.
async function power(objectPath, action) {
  const result = document.getElementById("power-result");
  const current = await fetch(objectPath, { credentials: "same-origin" });
  if (!current.ok) {
    result.textContent = await errorText(current);
    result.className = "error";
    return;
  }
  const vm = await current.json();
  if (action === "stop" || action === "start") {
    const stopped = vm.spec.running === false;
    if (stopped === (action === "stop")) {
      result.textContent = "already " + (stopped ? "stopped" : "running") + ": nothing written";
      result.className = "ok";
      return;
    }
    // Running is the default, left out of the spec.
    if (action === "stop") vm.spec.running = false;
    else delete vm.spec.running;
  } else {
    vm.spec.power = { action, at: new Date().toISOString() };
  }
  const message = "vm " + action + " (dashboard)";
  const response = await write("PUT", objectPath + "?message=" + encodeURIComponent(message), JSON.stringify(vm));
  if (response.ok) {
    const written = await response.json();
    result.textContent = action + ": revision " + written.metadata.revision;
    result.className = "ok";
  } else {
    result.textContent = await errorText(response);
    result.className = "error";
  }
}

// Calls `changed` (at most every 500 ms) whenever the object changes:
// the /v1 watch of this one object, read as a stream of JSON lines.
async function watchObject(plural, namespace, name, changed) {
  const collection = (namespace ? "/v1/namespaces/" + encodeURIComponent(namespace) : "/v1") + "/" + plural;
  const current = await fetch(collection + "/" + encodeURIComponent(name), { credentials: "same-origin" });
  if (!current.ok) return;
  const version = (await current.json()).metadata.resourceVersion || 0;
  const response = await fetch(collection + "?watch=true&name=" + encodeURIComponent(name) +
    "&resourceVersion=" + version, { credentials: "same-origin" });
  if (!response.ok) return;
  const reader = response.body.getReader();
  let timer = null;
  for (;;) {
    const { done } = await reader.read();
    if (done) break;
    if (timer === null) timer = setTimeout(() => { timer = null; changed(); }, 500);
  }
}

// Container logs, followed: the /v1 logs endpoint read as a stream.
async function streamLogs(namespace, name) {
  const out = document.getElementById("logs");
  const container = document.getElementById("log-container").value.trim();
  let url = "/v1/namespaces/" + encodeURIComponent(namespace) + "/pods/" + encodeURIComponent(name) +
    "/logs?follow=true";
  if (container) url += "&container=" + encodeURIComponent(container);
  out.textContent = "";
  const response = await fetch(url, { credentials: "same-origin" });
  if (!response.ok) {
    out.textContent = await errorText(response);
    return;
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    out.textContent += decoder.decode(value, { stream: true });
    out.scrollTop = out.scrollHeight;
  }
}

// The serial console: what it printed lately (the VM's console log),
// then a WebSocket; keys typed in the <pre> are sent as they are (Enter
// as a carriage return, as a terminal sends it).
async function openConsole(namespace, name) {
  const out = document.getElementById("console");
  const state = document.getElementById("console-state");
  const recent = await fetch("/v1/namespaces/" + encodeURIComponent(namespace) + "/virtualmachines/" +
    encodeURIComponent(name) + "/logs?tail=200", { credentials: "same-origin" });
  out.textContent = recent.ok ? terminalText(await recent.text()) : "";
  const socket = new WebSocket("wss://" + location.host + "/ui/console/" + encodeURIComponent(name) +
    "?namespace=" + encodeURIComponent(namespace));
  socket.binaryType = "arraybuffer";
  const decoder = new TextDecoder();
  socket.addEventListener("open", () => {
    state.textContent = "connected: type in the console";
    out.focus();
  });
  socket.addEventListener("close", () => { state.textContent = "disconnected"; });
  socket.addEventListener("message", (event) => {
    const text = typeof event.data === "string" ? "\n" + event.data + "\n" : decoder.decode(event.data, { stream: true });
    out.textContent += terminalText(text);
    out.scrollTop = out.scrollHeight;
  });
  out.addEventListener("keydown", (event) => {
    if (socket.readyState !== WebSocket.OPEN) return;
    let key = event.key;
    if (key === "Enter") key = "\r";
    else if (key === "Backspace") key = "\x7f";
    else if (key === "Tab") key = "\t";
    else if (event.ctrlKey && key.length === 1) key = String.fromCharCode(key.toUpperCase().charCodeAt(0) - 64);
    else if (key.length !== 1) return;
    event.preventDefault();
    socket.send(key);
  });
}

// Console output as plain text: no carriage returns, no escape sequences.
function terminalText(text) {
  return text.replace(/\r/g, "").replace(/\x1b\[[0-9;?]*[A-Za-z]/g, "");
}

// ---- Apply a pasted manifest.
function applyPage() {
  document.getElementById("manifest-file").addEventListener("change", async (event) => {
    const file = event.target.files[0];
    if (file) document.getElementById("manifest").value = await file.text();
  });
  document.getElementById("apply-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const namespace = document.getElementById("apply-namespace").value.trim();
    const result = document.getElementById("apply-result");
    const response = await write("POST", "/ui/apply?namespace=" + encodeURIComponent(namespace),
      document.getElementById("manifest").value, "text/plain");
    result.textContent = await response.text();
    result.className = response.ok ? "ok" : "error";
  });
}

if (page === "overview") overview();
else if (page === "object") objectPage();
else if (page === "apply") applyPage();
