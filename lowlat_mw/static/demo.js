// The demo page of `lowlat-mw serve`: a prompt box over the browser client (./lowlat.js).
//
// Query parameters (all optional): ws=<WebSocket URL or path>, mode=json|proto, delay=<seconds
// between the demo model's tokens>, tokens=<how many tokens the demo model streams>,
// backoff=<base seconds of the reconnect backoff>, retries=<reconnect attempts>, prompt=<text>.
// window.lowlatDemo exposes the client and what the page saw, for tests and curious consoles.
import { LowLatClient } from "./lowlat.js";

const $ = (id) => document.getElementById(id);
const query = new URLSearchParams(location.search);
const root = document.documentElement;

function wsUrl() {
  const given = query.get("ws") || root.dataset.wsPath || "/ws";
  if (/^wss?:\/\//.test(given)) return given;
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${location.host}${given.startsWith("/") ? "" : "/"}${given}`;
}

function number(name) {
  const v = query.get(name);
  return v === null || v === "" || Number.isNaN(Number(v)) ? undefined : Number(v);
}

const demo = {
  client: null,
  stream: null,
  states: [], // every state change: {state, resumed, code, at}
  streams: [], // per finished stream: {id, text, seqs, finish, error, ttft, tps, wire, raw}
  text: "",
  seqs: [],
};
window.lowlatDemo = demo;

const ui = {
  state: $("state"), session: $("session"), output: $("output"), status: $("status"), send: $("send"),
  stop: $("stop"), prompt: $("prompt"), mode: $("mode"), form: $("prompt-form"),
  ttft: $("ttft"), tps: $("tps"), rtt: $("rtt"), bytes: $("bytes"),
};
$("endpoint").textContent = wsUrl();

const fmtMs = (ms) => {
  if (ms === null || ms === undefined) return "\u2013";
  return ms < 10 ? `${ms.toFixed(1)} ms` : `${Math.round(ms)} ms`;
};
const fmtBytes = (n) => (n < 10000 ? `${n} B` : `${(n / 1024).toFixed(1)} KiB`);

function showState(detail) {
  const { state, resumed } = detail;
  const label = state === "connected" && resumed ? "resumed" : state === "idle" ? "disconnected" : state;
  const attempt = state === "reconnecting" && detail.attempt ? ` (attempt ${detail.attempt + 1})` : "";
  ui.state.textContent = label + attempt;
  ui.state.dataset.state = label === "disconnected" ? "idle" : label;
  const client = demo.client;
  ui.session.textContent = client && client.welcome && (state === "connected")
    ? `session ${client.welcome.session_id.slice(0, 8)} \u00b7 ${client.mode === "proto" ? "Protobuf" : "JSON"}` : "";
  demo.states.push({ state, label, resumed, code: detail.code ?? null, at: performance.now() });
}

function makeClient(mode) {
  const backoff = { base: number("backoff") ?? 1, retries: number("retries") ?? 5 };
  const client = new LowLatClient(wsUrl(), { mode, backoff, keepAlive: true });
  client.on("statechange", (detail) => { if (client === demo.client) showState(detail); });
  demo.client = client;
  client.connect().catch((err) => showError(err));
  return client;
}

function showError(err) {
  ui.status.textContent = `${err.name}: ${err.message}`;
  ui.status.className = "error";
}

let frame = 0;
function refreshNumbers() {
  frame = 0;
  const s = demo.stream;
  if (!s) return;
  ui.ttft.textContent = fmtMs(s.timeToFirstDelta);
  const tps = s.deltasPerSecond;
  ui.tps.textContent = tps === null ? "\u2013" : tps.toFixed(tps < 100 ? 1 : 0);
  const raw = s.end && s.end.usage && s.end.usage.output_bytes !== undefined ? s.end.usage.output_bytes : s.rawBytes;
  ui.bytes.textContent = raw ? `${fmtBytes(s.wireBytes)} for ${fmtBytes(raw)} of text` : "\u2013";
  if (raw && s.deltas) {
    // Per token, not a ratio: one-word tokens make any framing look like a large multiple of the text.
    const note = document.createElement("small");
    note.textContent = ` (${s.deltas} tokens, ${Math.round((s.wireBytes - raw) / s.deltas)} B framing each)`;
    note.title = "Each token travels as its own message: a WebSocket frame header, the stream id and a sequence "
      + "number (for resume after a dropped connection), plus the stream's End. With one-word tokens that is more "
      + "than the text itself; compression only pays off on larger messages.";
    ui.bytes.append(note);
  }
}
const scheduleRefresh = () => { if (!frame) frame = requestAnimationFrame(refreshNumbers); };

function setStreaming(on) {
  ui.stop.disabled = !on;
  ui.output.classList.toggle("streaming", on);
}

function send(prompt) {
  if (demo.stream && !demo.stream.finished) demo.stream.cancel();
  if (demo.client.state === "closed") makeClient(ui.mode.value); // closed for good (e.g. 1009): start afresh
  ui.output.textContent = "";
  ui.status.textContent = "";
  ui.status.className = "muted";
  demo.text = "";
  demo.seqs = [];
  const params = {};
  if (number("delay") !== undefined) params.delay = number("delay");
  if (number("tokens") !== undefined) params.tokens = number("tokens");
  const stream = demo.client.stream(prompt, {
    params,
    onDelta(chunk, delta) {
      if (stream !== demo.stream) return;
      const text = typeof chunk === "string" ? chunk : new TextDecoder().decode(chunk);
      demo.text += text;
      demo.seqs.push(delta.seq);
      const span = document.createElement("span");
      span.textContent = text;
      ui.output.append(span);
      scheduleRefresh();
    },
    onEnd(end) {
      finished(stream, end, null);
    },
    onError(err) {
      finished(stream, null, err);
    },
  });
  demo.stream = stream;
  setStreaming(true);
  ui.status.textContent = "streaming\u2026";
}

function finished(stream, end, err) {
  demo.streams.push({ id: stream.id, text: demo.text, seqs: demo.seqs.slice(), finish: end ? end.finish_reason : null,
    error: err ? { name: err.name, code: err.code ?? null, message: err.message } : null,
    ttft: stream.timeToFirstDelta, tps: stream.deltasPerSecond, wire: stream.wireBytes,
    raw: end && end.usage ? end.usage.output_bytes : stream.rawBytes });
  if (stream !== demo.stream) return;
  setStreaming(false);
  refreshNumbers();
  if (err) {
    showError(err);
    return;
  }
  const ms = stream.finishedAt - stream.startedAt;
  ui.status.textContent = end.finish_reason === "cancelled"
    ? `stopped after ${stream.deltas} tokens (${Math.round(ms)} ms)`
    : `done: ${stream.deltas} tokens in ${Math.round(ms)} ms`;
  ui.status.dataset.finish = end.finish_reason;
}

ui.form.addEventListener("submit", (event) => {
  event.preventDefault();
  const prompt = ui.prompt.value.trim();
  if (prompt) send(prompt);
});
ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    ui.form.requestSubmit();
  }
});
ui.stop.addEventListener("click", () => {
  if (demo.stream) demo.stream.cancel();
});
ui.mode.addEventListener("change", () => {
  if (demo.client) demo.client.close();
  makeClient(ui.mode.value);
});

// Heartbeat RTT: a protocol Ping from the client every 2 s; the server answers with a Pong.
setInterval(() => {
  const client = demo.client;
  if (client && client.connected) client.ping().then((ms) => { ui.rtt.textContent = fmtMs(ms); }, () => {});
}, 2000);

const mode = query.get("mode") === "proto" ? "proto" : "json";
ui.mode.value = mode;
if (query.get("prompt")) ui.prompt.value = query.get("prompt");
makeClient(mode).connect().then(() => {
  const c = demo.client;
  if (c.connected) c.ping().then((ms) => { ui.rtt.textContent = fmtMs(ms); }, () => {});
}, () => {});
