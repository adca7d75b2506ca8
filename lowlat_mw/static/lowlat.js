// lowlat.js: the browser client of the lowlat-mw wire protocol v1 (docs/protocol.md).
//
// A dependency-free ES module. Usage (docs/browser.md has the whole API):
//
//   import { LowLatClient } from "/lowlat/lowlat.js";
//   const client = new LowLatClient();                 // ws(s)://<this host>/ws, JSON text frames
//   for await (const chunk of client.stream("hello")) output.append(chunk);
//
// It behaves like the Python client (lowlat_mw/client/): one WebSocket multiplexing many
// streams, answers to the server's Pings and Pings of its own when the link is quiet, reconnects
// with exponential backoff and full jitter, resumes open streams after a drop (Hello with
// resume_token and last_seq, Acks as the application consumes) and reports close codes and
// server errors as Error subclasses. It speaks protocol revision 3 (v1.3): push groups
// (`await client.subscribe("news")`) and the server's pushes (the "push" event, `client.pushes()`), warm-up
// requests (`await client.warmup("system prompt")`, or the `warmup` option on every new session),
// full-duplex streams (a model's tool calls arrive as ToolCall chunks, answered with `stream.sendResult()` or
// by the `tools` option; `stream.send()` and `stream.endInput()` send more input while the stream runs), and
// incremental context (`const doc = await client.context("main.py", text)`, `doc.patch(...)`,
// `client.stream(q, { context: [doc], continues: previousStream })`).

export const VERSION = "0.1.0";
export const SUBPROTOCOL_JSON = "lowlat.v1.json";
export const SUBPROTOCOL_PROTO = "lowlat.v1.proto";
/** The protocol revision this client implements (Hello.revision): 3 is v1.3 (Input, Delta.tool_call; Context,
 * Request.contexts and continues), 2 is v1.2 (Request.warmup), 1 is v1.1 (Subscribe, Subscribed, Push). */
export const PROTOCOL_REVISION = 3;
/** The revision that brought Request.warmup: sent only to a server whose Welcome says at least this. */
export const WARMUP_REVISION = 2;
/** The revision that brought full-duplex streams (Input, Delta.tool_call, Welcome.input_seq): Input is sent only
 * to a server whose Welcome says at least this. */
export const DUPLEX_REVISION = 3;
/** The revision that brought context documents (Context, ContextAck), Request.contexts and Request.continues. */
export const CONTEXT_REVISION = 3;
const CLIENT_NAME = `lowlat-mw-js/${VERSION}`;

// ----------------------------------------------------------------------------- close codes
/** What each close code means (docs/protocol.md section 12). */
export const CLOSE_CODES = Object.freeze({
  1000: "normal closure",
  1001: "going away",
  1002: "protocol error",
  1003: "unsupported data",
  1005: "no status",
  1006: "connection lost",
  1007: "invalid payload",
  1008: "policy violation (unauthorized)",
  1009: "message too big",
  1011: "internal server error",
  1012: "service restart",
  1013: "try again later",
  1014: "bad gateway",
  4000: "idle timeout",
  4001: "heartbeat timeout",
  4002: "server draining",
  4003: "slow consumer",
  4004: "handshake timeout",
  4005: "session expired",
});
const RECONNECT_CODES = new Set([1001, 1005, 1006, 1011, 1012, 1013, 1014, 4000, 4001, 4002, 4003, 4004, 4005]);

/** 4101-4199 are aliases of 1001-1099 (sent by servers that only allow 1000 and 3000-4999). */
export function canonicalCloseCode(code) {
  return typeof code === "number" && code > 4100 && code < 4200 ? code - 3100 : code;
}

/** Whether a client should reconnect (with backoff) after close `code`. */
export function closeCodeReconnects(code) {
  const c = canonicalCloseCode(code);
  return c === undefined || c === null || RECONNECT_CODES.has(c);
}

// ----------------------------------------------------------------------------- errors
/** Base class of every error this client raises on purpose. */
export class LowLatError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = "LowLatError";
  }
}

/** The server ended a stream (or refused a message) with an Error: `code` is its JSON name. */
export class StreamError extends LowLatError {
  constructor({ code = "unspecified", message = "", stream_id = 0, retryable = false } = {}) {
    super(`${code}: ${message}`);
    this.name = "StreamError";
    this.code = code;
    this.serverMessage = message;
    this.streamId = stream_id;
    this.retryable = retryable;
  }
}

/** A stream cut by a drop could not be resumed (the session expired, or its output is gone). */
export class ResumeFailedError extends StreamError {
  constructor(fields) {
    super(fields);
    this.name = "ResumeFailedError";
  }
}

/** The connection closed with a code after which the client does not reconnect (or was closed by you). */
export class ConnectionClosedError extends LowLatError {
  constructor(code, reason = "", options) {
    const canonical = canonicalCloseCode(code);
    const meaning = CLOSE_CODES[canonical] || "unknown close code";
    super(`connection closed (${code ?? "no code"}: ${meaning})${reason ? `: ${reason}` : ""}`, options);
    this.name = "ConnectionClosedError";
    this.code = canonical;
    this.rawCode = code;
    this.reason = reason;
    this.meaning = meaning;
    this.reconnect = closeCodeReconnects(code);
  }
}

/** The server, or a proxy in front of it, answered the WebSocket handshake with HTTP `status` instead of accepting
 * it: not retried. Only where the WebSocket implementation tells the status (the `ws` package does; a browser never
 * does: there a refusal looks like a connection that failed). `reason` is the answer's text (lowlat-mw names the
 * check that refused: the Origin, the subprotocol), else the message says what the status most likely means. */
export class HandshakeRefusedError extends ConnectionClosedError {
  constructor(status, path = "/", reason = "", options) {
    super(null, reason, options);
    this.name = "HandshakeRefusedError";
    this.message = `handshake refused with HTTP ${status}: ${reason || refusalHint(status, path)}`;
    this.status = status;
    this.path = path;
    this.reconnect = false;
  }
}

/** What HTTP `status` answering a WebSocket handshake for `path` most likely means (the Python client's
 * lowlat_mw.errors.refusal_hint says the same). */
export function refusalHint(status, path) {
  if (status === 404) return `no WebSocket endpoint at ${path}: check the URL's path (the endpoint's \`path\` setting, /ws by default)`;
  if (status === 403) {
    return `no reason given: no WebSocket route at ${path} (Starlette and FastAPI refuse an unknown path with 403), `
      + "an Origin the server does not allow (allowed_origins), or no subprotocol it serves";
  }
  if (status === 401 || status === 407) return "authentication required, by the app or a proxy in front of the endpoint";
  return "the server, or a proxy in front of it, does not take WebSocket handshakes at this URL";
}

/** The client gave up connecting: every attempt failed (`cause`: the last failure), or the first connection was
 * refused (nothing listens there; where the runtime tells: Node's `ws` does, a browser does not). */
export class ReconnectFailedError extends LowLatError {
  constructor(url, attempts, cause) {
    let why = ` (server down, or the handshake was refused: an Origin the server does not allow, a wrong path?)`;
    if (cause && cause.refused) why = ": connection refused (nothing listens there: is the server running, on this port?)";
    else if (cause && cause.message && !(cause.code === 1006 && cause.reason === "connection failed")) {
      why = `: ${cause.message}`; // (a browser says no more than 1006: its console shows a refused handshake's status)
    }
    super(`could not connect to ${url} after ${attempts} attempt${attempts === 1 ? "" : "s"}${why}`, { cause });
    this.name = "ReconnectFailedError";
    this.attempts = attempts;
  }
}

/** The runtime has no WebSocket (Node.js before 22) and none was given as the `WebSocket` option. */
export class NoWebSocketError extends LowLatError {
  constructor() {
    super('no WebSocket implementation: this runtime has none (Node.js before 22): pass one as the WebSocket option, '
          + 'e.g. `import WebSocket from "ws"; await connect(url, { WebSocket })`');
    this.name = "NoWebSocketError";
  }
}

// ----------------------------------------------------------------------------- tool calls (v1.3)
/** The model asks the client to run tool `name` (protocol v1.3): a stream's chunk. `arguments` is the JSON text
 * the server sent, `args` that text parsed (null if empty or not JSON). Answer it with
 * `stream.sendResult(call, content)`, or let the `tools` option of `client.stream()` answer it. */
export class ToolCall {
  constructor({ id = "", name = "", arguments: text = "" } = {}) {
    this.id = String(id);
    this.name = String(name);
    this.arguments = String(text);
    let args = null;
    if (this.arguments) {
      try { args = JSON.parse(this.arguments); } catch { args = null; }
    }
    this.args = args;
  }
}

/** A tool's result as the text of a ToolResult: a string as it is, anything else as JSON ("null" for undefined). */
function resultText(content) {
  if (typeof content === "string") return content;
  const text = JSON.stringify(content);
  return text === undefined ? "null" : text;
}

/** A Delta's chunk: its text, its bytes or (v1.3) its ToolCall. */
function chunkOf(delta) {
  return delta.text ?? delta.data ?? delta.tool_call;
}

/** A Delta's size as flow control and the replay buffer count it: UTF-8 bytes of text (of a tool call's id, name
 * and arguments), bytes of data. */
function chunkSize(delta) {
  if (delta.text !== undefined) return utf8Length(delta.text);
  if (delta.data) return delta.data.length;
  const call = delta.tool_call;
  return call ? utf8Length(call.id) + utf8Length(call.name) + utf8Length(call.arguments) : 0;
}

// ----------------------------------------------------------------------------- backoff
/** Delay before retry n (0-based) is uniform in [0, min(cap, base * factor**n)] seconds (full jitter). */
export class Backoff {
  constructor({ base = 1, factor = 2, cap = 30, retries = 5, jitter = true, random = Math.random } = {}) {
    if (base < 0 || factor < 1 || cap < 0 || retries < 0) {
      throw new RangeError("backoff needs base >= 0, factor >= 1, cap >= 0, retries >= 0");
    }
    Object.assign(this, { base, factor, cap, retries, jitter, random });
  }

  ceiling(attempt) {
    return Math.min(this.cap, this.base * this.factor ** Math.min(attempt, 64));
  }

  /** Seconds to wait before retry number `attempt`. */
  delay(attempt) {
    const ceiling = this.ceiling(attempt);
    return this.jitter ? this.random() * ceiling : ceiling;
  }
}

// ----------------------------------------------------------------------------- codecs
const ERROR_CODES = ["unspecified", "bad_request", "model_error", "too_many_streams", "stream_id_in_use",
  "protocol_error", "invalid_payload", "message_too_big", "unsupported_compression", "unsupported_message",
  "resume_failed", "rate_limited", "unauthorized", "internal", "draining", "unknown_model", "context_mismatch",
  "context_limit"];
const utf8 = new TextEncoder();
const utf8Decoder = new TextDecoder("utf-8", { fatal: true });

/** Whether `s` holds a UTF-16 surrogate without its pair (not Unicode text: UTF-8 cannot carry it). */
function loneSurrogate(s) {
  return /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/.test(s);
}

/** UTF-8 size of a string, without encoding it. */
export function utf8Length(s) {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      n += 4; // a surrogate pair: one 4-byte character
      i++;
    } else n += 3; // (a lone surrogate: TextEncoder writes U+FFFD, 3 bytes)
  }
  return n;
}

function toBase64(bytes) {
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

// SHA-256 (FIPS 180-4) of bytes, synchronous: crypto.subtle is asynchronous and absent outside secure contexts.
const SHA_K = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
  0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
  0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
  0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
  0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
  0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
  0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
  0xc67178f2]);

/** SHA-256 of `bytes` (a Uint8Array), as a 32-byte Uint8Array. */
export function sha256(bytes) {
  const length = bytes.length;
  const blocks = Math.ceil((length + 9) / 64);
  const buf = new Uint8Array(blocks * 64);
  buf.set(bytes);
  buf[length] = 0x80;
  const view = new DataView(buf.buffer);
  view.setUint32(buf.length - 8, Math.floor(length / 0x20000000));
  view.setUint32(buf.length - 4, (length * 8) >>> 0);
  const h = new Uint32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
    0x5be0cd19]);
  const w = new Uint32Array(64);
  for (let b = 0; b < blocks; b++) {
    for (let i = 0; i < 16; i++) w[i] = view.getUint32(b * 64 + i * 4);
    for (let i = 16; i < 64; i++) {
      const x = w[i - 15];
      const y = w[i - 2];
      const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
      const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
      w[i] = (w[i - 16] + s0 + w[i - 7] + s1) | 0;
    }
    let [a, bb, c, d, e, f, g, hh] = h;
    for (let i = 0; i < 64; i++) {
      const S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      const t1 = (hh + S1 + ((e & f) ^ (~e & g)) + SHA_K[i] + w[i]) | 0;
      const S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      const t2 = (S0 + ((a & bb) ^ (a & c) ^ (bb & c))) | 0;
      hh = g; g = f; f = e; e = (d + t1) | 0; d = c; c = bb; bb = a; a = (t1 + t2) | 0;
    }
    h[0] += a; h[1] += bb; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += hh;
  }
  const out = new Uint8Array(32);
  const outView = new DataView(out.buffer);
  for (let i = 0; i < 8; i++) outView.setUint32(i * 4, h[i]);
  return out;
}

function fromBase64(text) {
  const s = atob(text);
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

/** JSON text frames (`lowlat.v1.json`): messages are the protocol's JSON objects; `data` is a Uint8Array. */
export const jsonCodec = Object.freeze({
  subprotocol: SUBPROTOCOL_JSON,
  binary: false,
  encode(msg) {
    if (msg.data instanceof Uint8Array) msg = { ...msg, data: toBase64(msg.data) };
    if (msg.sha256 instanceof Uint8Array) msg = { ...msg, sha256: toBase64(msg.sha256) }; // (a Context, v1.3)
    return JSON.stringify(msg);
  },
  decode(frame) {
    if (typeof frame !== "string") throw new LowLatError("binary frame on a JSON connection");
    const msg = JSON.parse(frame);
    if (msg === null || typeof msg !== "object" || typeof msg.type !== "string") {
      throw new LowLatError("frame is not a protocol message");
    }
    if ((msg.type === "delta" || msg.type === "push") && typeof msg.data === "string") msg.data = fromBase64(msg.data);
    else if (msg.type === "delta" && msg.tool_call !== null && typeof msg.tool_call === "object") {
      msg.tool_call = new ToolCall(msg.tool_call); // (v1.3)
    } else if (msg.type === "welcome") {
      msg.revision ??= 0; // (omitted by a v1.0 server, and when 0)
      msg.input_seq ??= {}; // (v1.3: omitted by an older server)
      msg.contexts ??= {};
    } else if (msg.type === "context_ack") { msg.code ??= "unspecified"; msg.message ??= ""; } // (only when refused)
    else if (msg.type === "subscribed") { msg.code ??= "unspecified"; msg.message ??= ""; } // (only when refused)
    return msg;
  },
});

// Protobuf (`lowlat.v1.proto`): a hand-written encoder/decoder for the schema's few messages
// (lowlat_mw/proto/lowlat_v1.proto), uncompressed (the client offers no codec, so the server sends
// header 0x10 only). Numbers above 2**53 are not expected anywhere in v1.
class Writer {
  constructor() { this.bytes = []; }
  varint(n) {
    n = Math.max(0, Math.floor(n));
    while (n > 0x7f) { this.bytes.push((n % 128) | 0x80); n = Math.floor(n / 128); }
    this.bytes.push(n);
    return this;
  }
  tag(field, wire) { return this.varint(field * 8 + wire); }
  uint(field, n) { return n ? this.tag(field, 0).varint(n) : this; }
  bool(field, b) { return b ? this.tag(field, 0).varint(1) : this; }
  raw(field, bytes) {
    this.tag(field, 2).varint(bytes.length);
    for (let i = 0; i < bytes.length; i++) this.bytes.push(bytes[i]);
    return this;
  }
  str(field, s, always = false) { return s || always ? this.raw(field, utf8.encode(s || "")) : this; }
  double(field, x) {
    const b = new Uint8Array(8);
    new DataView(b.buffer).setFloat64(0, x, true);
    this.tag(field, 1);
    for (const v of b) this.bytes.push(v);
    return this;
  }
  msg(field, build) { const w = new Writer(); build(w); return this.raw(field, w.bytes); }
  finish() { return Uint8Array.from(this.bytes); }
}

function writeValue(w, v) {
  if (v === null || v === undefined) w.tag(1, 0).varint(0);
  else if (typeof v === "number") w.double(2, v);
  else if (typeof v === "string") w.str(3, v, true);
  else if (typeof v === "boolean") w.tag(4, 0).varint(v ? 1 : 0);
  else if (Array.isArray(v)) w.msg(6, (l) => v.forEach((item) => l.msg(1, (x) => writeValue(x, item))));
  else if (typeof v === "object") w.msg(5, (s) => writeStruct(s, v));
  else throw new TypeError(`params cannot hold a ${typeof v}`);
}

function writeStruct(w, obj) {
  for (const [key, value] of Object.entries(obj)) {
    w.msg(1, (e) => { e.str(1, key, true); e.msg(2, (x) => writeValue(x, value)); });
  }
}

const ENCODERS = {
  hello: [1, (w, m) => {
    w.str(1, m.client);
    (m.compression || []).forEach((c) => w.str(2, c, true));
    w.str(3, m.resume_token);
    for (const [sid, seq] of Object.entries(m.last_seq || {})) {
      w.msg(4, (e) => { e.tag(1, 0).varint(Number(sid)); e.tag(2, 0).varint(seq); });
    }
    w.uint(5, m.flow_window).str(6, m.auth).uint(7, m.revision).bool(9, m.history);
  }],
  request: [3, (w, m) => {
    w.uint(1, m.stream_id).str(2, m.model);
    if (m.text !== undefined && m.text !== null) w.str(3, m.text, true);
    if (m.data instanceof Uint8Array) w.raw(4, m.data);
    if (m.messages) {
      w.msg(5, (l) => m.messages.forEach((c) => l.msg(1, (x) => x.str(1, c.role).str(2, c.content))));
    }
    if (m.params && Object.keys(m.params).length) w.msg(6, (s) => writeStruct(s, m.params));
    w.bool(7, m.warmup); // (v1.2)
    (m.contexts || []).forEach((name) => w.str(8, name, true)); // (v1.3)
    w.uint(9, m.continues);
  }],
  context: [16, (w, m) => { // (v1.3)
    w.str(1, m.name).uint(2, m.version).uint(3, m.base_version).str(4, m.text);
    (m.patches || []).forEach((p) => w.msg(5, (x) => x.uint(1, p.offset).uint(2, p.length).str(3, p.text)));
    if (m.sha256 instanceof Uint8Array && m.sha256.length) w.raw(6, m.sha256);
    w.bool(7, m.drop);
  }],
  cancel: [7, (w, m) => w.uint(1, m.stream_id)],
  ping: [8, (w, m) => w.uint(1, m.id)],
  pong: [9, (w, m) => w.uint(1, m.id)],
  ack: [11, (w, m) => w.uint(1, m.stream_id).uint(2, m.seq).bool(3, m.done)],
  subscribe: [12, (w, m) => w.uint(1, m.id).str(2, m.group).bool(3, m.leave)],
  input: [15, (w, m) => { // (v1.3)
    w.uint(1, m.stream_id).uint(2, m.seq);
    if (m.text !== undefined && m.text !== null) w.str(3, m.text, true);
    if (m.data instanceof Uint8Array) w.raw(4, m.data);
    const r = m.tool_result;
    if (r) w.msg(5, (x) => x.str(1, r.id).str(2, r.content).bool(3, r.is_error));
    w.bool(6, m.end);
  }],
  error: [6, (w, m) => w.uint(1, m.stream_id).uint(2, Math.max(0, ERROR_CODES.indexOf(m.code)))
    .str(3, m.message).bool(4, m.retryable)],
};

function readVarint(buf, pos) {
  let value = 0;
  let scale = 1;
  for (let i = 0; i < 10; i++) {
    if (pos.i >= buf.length) throw new LowLatError("truncated varint");
    const b = buf[pos.i++];
    value += (b & 0x7f) * scale;
    if (b < 0x80) return value;
    scale *= 128;
  }
  throw new LowLatError("varint too long");
}

/** Calls fn(field, wireType, value) for each field of the message in `buf`; value is a number
 * (varint), a Uint8Array (length-delimited) or a DataView of 8 bytes (fixed64). */
function readFields(buf, fn) {
  const pos = { i: 0 };
  while (pos.i < buf.length) {
    const key = readVarint(buf, pos);
    const field = Math.floor(key / 8);
    const wire = key % 8;
    let value;
    if (wire === 0) value = readVarint(buf, pos);
    else if (wire === 1) {
      if (pos.i + 8 > buf.length) throw new LowLatError("truncated fixed64");
      value = new DataView(buf.buffer, buf.byteOffset + pos.i, 8);
      pos.i += 8;
    } else if (wire === 2) {
      const n = readVarint(buf, pos);
      if (pos.i + n > buf.length) throw new LowLatError("truncated field");
      value = buf.subarray(pos.i, pos.i + n);
      pos.i += n;
    } else if (wire === 5) {
      pos.i += 4;
      continue;
    } else throw new LowLatError(`unsupported wire type ${wire}`);
    fn(field, wire, value);
  }
}

const str = (v) => utf8Decoder.decode(v);

function readMap(buf, readValue) {
  let key = "";
  let value;
  readFields(buf, (f, wire, v) => {
    if (f === 1) key = wire === 2 ? str(v) : v;
    else if (f === 2) value = readValue(v, wire);
  });
  return [key, value];
}

const DECODERS = {
  2: ["welcome", (m, f, wire, v) => {
    const names = [null, "session_id", "resume_token", "compression", "max_frame_size", "max_decompressed_size",
      "max_streams", "heartbeat_interval_ms", "idle_timeout_ms", "server", "resumed", "resume_window_ms",
      "flow_window", "revision", "input_seq", "contexts"];
    if (f === 14) { // (v1.3) input_seq: stream id -> seq of the last Input the server holds
      const [k, x] = readMap(v, (n) => n);
      m.input_seq[k] = x ?? 0;
      return;
    }
    const name = names[f];
    if (!name) return;
    if (f === 3) m.compression.push(str(v));
    else if (f === 10) m.resumed = Boolean(v);
    else if (f === 15) { const [k, x] = readMap(v, (n) => n); m.contexts[k] = x ?? 0; } // (v1.3)
    else m[name] = wire === 2 ? str(v) : v;
  }, () => ({ session_id: "", resume_token: "", compression: [], max_frame_size: 0, max_decompressed_size: 0,
    max_streams: 0, heartbeat_interval_ms: 0, idle_timeout_ms: 0, server: "", resumed: false,
    resume_window_ms: 0, flow_window: 0, revision: 0, input_seq: {}, contexts: {} })],
  4: ["delta", (m, f, wire, v) => {
    if (f === 1) m.stream_id = v;
    else if (f === 2) m.seq = v;
    else if (f === 3) m.text = str(v);
    else if (f === 4) m.data = v.slice();
    else if (f === 5) { // (v1.3)
      const call = { id: "", name: "", arguments: "" };
      readFields(v, (g, w, x) => {
        if (g === 1) call.id = str(x);
        else if (g === 2) call.name = str(x);
        else if (g === 3) call.arguments = str(x);
      });
      m.tool_call = new ToolCall(call);
    }
  }, () => ({ stream_id: 0, seq: 0 })],
  5: ["end", (m, f, wire, v) => {
    if (f === 1) m.stream_id = v;
    else if (f === 2) m.last_seq = v;
    else if (f === 3) m.finish_reason = str(v);
    else if (f === 4) {
      const [k, x] = readMap(v, (d, w) => (w === 1 ? d.getFloat64(0, true) : 0));
      m.timings_ms[k] = x ?? 0;
    } else if (f === 5) {
      const [k, x] = readMap(v, (n) => n);
      m.usage[k] = x ?? 0;
    }
  }, () => ({ stream_id: 0, last_seq: 0, finish_reason: "", timings_ms: {}, usage: {} })],
  6: ["error", (m, f, wire, v) => {
    if (f === 1) m.stream_id = v;
    else if (f === 2) m.code = ERROR_CODES[v] || "unspecified";
    else if (f === 3) m.message = str(v);
    else if (f === 4) m.retryable = Boolean(v);
  }, () => ({ stream_id: 0, code: "unspecified", message: "", retryable: false })],
  8: ["ping", (m, f, wire, v) => { if (f === 1) m.id = v; }, () => ({ id: 0 })],
  9: ["pong", (m, f, wire, v) => { if (f === 1) m.id = v; }, () => ({ id: 0 })],
  10: ["goaway", (m, f, wire, v) => {
    if (f === 1) m.reason = str(v);
    else if (f === 2) m.reconnect_after_ms = v;
  }, () => ({ reason: "", reconnect_after_ms: 0 })],
  13: ["subscribed", (m, f, wire, v) => {
    if (f === 1) m.id = v;
    else if (f === 2) m.group = str(v);
    else if (f === 3) m.leave = Boolean(v);
    else if (f === 4) m.code = ERROR_CODES[v] || "unspecified";
    else if (f === 5) m.message = str(v);
  }, () => ({ id: 0, group: "", leave: false, code: "unspecified", message: "" })],
  17: ["context_ack", (m, f, wire, v) => { // (v1.3)
    if (f === 1) m.name = str(v);
    else if (f === 2) m.version = v;
    else if (f === 3) m.code = ERROR_CODES[v] || "unspecified";
    else if (f === 4) m.message = str(v);
  }, () => ({ name: "", version: 0, code: "unspecified", message: "" })],
  14: ["push", (m, f, wire, v) => {
    if (f === 1) m.topic = str(v);
    else if (f === 2) { m.text = str(v); delete m.data; } // (a oneof: the last one given wins)
    else if (f === 3) { m.data = v.slice(); delete m.text; }
  }, () => ({ topic: "" })],
};

/** Binary frames (`lowlat.v1.proto`): header byte 0x10 + a Protobuf Envelope, never compressed. */
export const protoCodec = Object.freeze({
  subprotocol: SUBPROTOCOL_PROTO,
  binary: true,
  encode(msg) {
    const enc = ENCODERS[msg.type];
    if (!enc) throw new LowLatError(`cannot encode a ${msg.type} message`);
    const w = new Writer();
    w.bytes.push(0x10);
    w.msg(enc[0], (inner) => enc[1](inner, msg));
    return w.finish();
  },
  decode(frame) {
    if (typeof frame === "string") throw new LowLatError("text frame on a Protobuf connection");
    const buf = new Uint8Array(frame);
    if (!buf.length || buf[0] >> 4 !== 1) throw new LowLatError("not a version 1 frame");
    if ((buf[0] & 0x0f) !== 0) throw new LowLatError(`compressed frame (codec ${buf[0] & 0x0f}) was not negotiated`);
    let msg = { type: "unknown" };
    readFields(buf.subarray(1), (field, wire, value) => {
      const dec = DECODERS[field];
      if (!dec || wire !== 2) return;
      const m = { type: dec[0], ...dec[2]() };
      readFields(value, (f, w, v) => dec[1](m, f, w, v));
      msg = m;
    });
    return msg;
  },
});

// ----------------------------------------------------------------------------- context documents (v1.3)
/**
 * A context document of the client's session, made by `client.context(name, text)`: change it with `set()`,
 * `patch(offset, length, text)` (offsets and lengths in UTF-16 code units, as String.prototype.slice counts; UTF-8
 * bytes on the wire) and `replace(old, new)`; name it in `client.stream(q, { context: [doc] })`. Each change goes
 * out at once with the SHA-256 of the whole text, which the server checks; when it refuses one, or a connection's
 * session does not hold this version, the client sends the whole text again by itself.
 */
export class ContextDocument {
  constructor(client, name) {
    if (!name || name.length > 200 || /[\u0000-\u001f\u007f-\u009f]/.test(name)) {
      throw new RangeError("a context name is 1 to 200 characters, no control characters");
    }
    this._client = client;
    this.name = name;
    this.text = "";
    this.version = 0; // the last version made
    this.acked = 0; // the highest version the server acknowledged
    this.resync = 0; // the version of the last whole text sent: refusals of older versions are stale
    this.refusal = null; // the last refusal that was not stale (a context_ack with a code)
    this.fullSends = 0; // whole texts sent (the first, and every recovery)
    this.failed = null; // a refusal that sending the text again cannot cure (a limit, a bad name)
    this._waiters = [];
  }

  /** Whether the server acknowledged the current version. */
  get synced() {
    return this.version > 0 && this.acked >= this.version;
  }

  _full(text) {
    this.failed = null;
    this.text = text;
    this.version = this.resync = this.version + 1;
    this.fullSends++;
    return { type: "context", name: this.name, version: this.version, base_version: 0, text,
      sha256: sha256(utf8.encode(text)) };
  }

  /** Replace the whole text (RangeError for a lone surrogate: not Unicode text, the server could not take it). */
  set(text) {
    text = String(text);
    if (loneSurrogate(text)) throw new RangeError("a context document's text holds a lone surrogate");
    this._client._sendContext(this._full(text));
  }

  /** Replace `length` code units at `offset` with `text`; RangeError outside the text or inside a surrogate pair. */
  patch(offset, length, text) {
    const old = this.text;
    if (!(Number.isInteger(offset) && Number.isInteger(length) && offset >= 0 && length >= 0
          && offset + length <= old.length)) {
      throw new RangeError(`patch ${offset}+${length} is outside the text of ${old.length} code units`);
    }
    const splits = (i) => i > 0 && i < old.length && (old.charCodeAt(i) & 0xfc00) === 0xdc00
      && (old.charCodeAt(i - 1) & 0xfc00) === 0xd800;
    if (splits(offset) || splits(offset + length)) throw new RangeError("a patch may not split a surrogate pair");
    text = String(text);
    if (loneSurrogate(text)) throw new RangeError("a patch's text holds a lone surrogate");
    const head = old.slice(0, offset);
    const patch = { offset: utf8Length(head), length: utf8Length(old.slice(offset, offset + length)), text };
    this.text = head + text + old.slice(offset + length);
    const base = this.version;
    this.version += 1;
    this._client._sendContext({ type: "context", name: this.name, version: this.version, base_version: base,
      patches: [patch], sha256: sha256(utf8.encode(this.text)) });
  }

  /** Replace the first occurrence of `old` with `replacement`; RangeError if it does not occur. */
  replace(old, replacement) {
    const at = this.text.indexOf(old);
    if (at < 0) throw new RangeError(`${JSON.stringify(old)} is not in document ${JSON.stringify(this.name)}`);
    this.patch(at, old.length, replacement);
  }

  /** Forget the document, here and on the server. */
  drop() {
    this._client.documents.delete(this.name);
    this._client._dropped.set(this.name, this.version); // (a new document of this name counts on from it)
    this._client._sendContext({ type: "context", name: this.name, version: this.version, drop: true });
  }

  /** Resolve once the server acknowledged the current version (reject after `timeout` ms). */
  whenSynced(timeout = 10000) {
    if (this.synced) return Promise.resolve();
    if (this.failed) return Promise.reject(new StreamError({ code: this.failed.code, message: this.failed.message }));
    return new Promise((resolve, reject) => {
      const waiter = { resolve, reject, timer: setTimeout(() => {
        this._waiters = this._waiters.filter((x) => x !== waiter);
        reject(new LowLatError(`context ${this.name} not acknowledged within ${timeout} ms`));
      }, timeout) };
      this._waiters.push(waiter);
    });
  }

  /** The server's ContextAck: the whole text to send again after a (not stale) refusal, else null. */
  _answered(ack) {
    let again = null;
    if (ack.code === "unspecified") this.acked = Math.max(this.acked, ack.version);
    else if (ack.version >= this.resync) {
      this.refusal = ack;
      // A limit, a bad name, or the whole text itself refused: sending it again would be refused again.
      if (ack.code !== "context_mismatch" || ack.version === this.resync) this.failed = ack;
      else again = this._full(this.text);
    }
    if (this.synced || this.failed) {
      const waiters = this._waiters.splice(0);
      for (const w of waiters) {
        clearTimeout(w.timer);
        if (this.synced) w.resolve();
        else w.reject(new StreamError({ code: this.failed.code, message: this.failed.message }));
      }
    }
    return again;
  }

  /** A connection opened whose session holds `held` (name -> version): the whole text if this version is not. */
  _welcomed(held) {
    if (this.version && held[this.name] === this.version) {
      this.acked = this.version;
      return null;
    }
    return this._full(this.text);
  }
}

// ----------------------------------------------------------------------------- streams
/**
 * One streamed reply. Iterate it (`for await (const chunk of stream)`: strings, or Uint8Array for
 * binary output, or a ToolCall when the model asks for a tool, v1.3) or pass callbacks to `client.stream()`.
 * `stream.done` resolves with the server's End (`finish_reason` "stop" or "cancelled", `usage`, `timings_ms`)
 * or rejects with the error. While it runs, `send()`, `sendResult()` and `endInput()` give the model more input.
 */
export class Stream {
  constructor(client, request, callbacks, tools = null) {
    this.client = client;
    this.id = request.stream_id;
    this.request = request;
    this.callbacks = callbacks;
    this.tools = tools || null; // (v1.3) tool name -> function: the stream answers the model's calls of these itself
    this.status = "pending"; // pending | streaming | done | failed
    this.end = null;
    this.error = null;
    this.receivedSeq = 0; // seq of the last Delta received: a resume asks for what follows
    this.deliveredSeq = 0; // seq of the last Delta handed to the application
    this.startedAt = null; // performance.now() when the Request was sent
    this.firstDeltaAt = null;
    this.finishedAt = null;
    this.deltas = 0;
    this.rawBytes = 0; // UTF-8 / binary size of the chunks received
    this.wireBytes = 0; // size on the wire of this stream's frames (Deltas and End)
    this.resends = 0;
    this._sent = false;
    this._cancelled = false; // cancel() was called: an End "cancelled" is its answer
    this._unacked = 0;
    this._buffer = [];
    this._waiter = null;
    this._terminal = null;
    this._inputs = []; // (v1.3) every Input of the stream, in seq order, kept until it ends (a resume resends)
    this._sentInputs = 0; // how many of them went out on this connection (a resumed Welcome resets it)
    this._inputEnded = false; // an Input with end was added
    this._inputTail = Promise.resolve(); // send(), sendResult() and endInput() run one after the other
    this.done = new Promise((resolve, reject) => { this._resolve = resolve; this._reject = reject; });
    this.done.catch(() => {}); // a stream consumed by iteration need not await `done`
  }

  /** Milliseconds from sending the Request to the first Delta (null before it). */
  get timeToFirstDelta() {
    return this.firstDeltaAt === null || this.startedAt === null ? null : this.firstDeltaAt - this.startedAt;
  }

  /** Deltas per second from the first Delta on (null before the second one). */
  get deltasPerSecond() {
    if (this.firstDeltaAt === null || this.deltas < 2) return null;
    const last = this.finishedAt ?? performance.now();
    return last > this.firstDeltaAt ? ((this.deltas - 1) * 1000) / (last - this.firstDeltaAt) : null;
  }

  get finished() {
    return this.status === "done" || this.status === "failed";
  }

  /** Ask the server to stop this stream; it then ends with End(finish_reason "cancelled"). */
  cancel() {
    this.client._cancel(this);
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  async next() {
    for (;;) {
      if (this._buffer.length) {
        const delta = this._buffer.shift();
        this._delivered(delta);
        if (this._answers(delta)) continue; // (its tool runs: started as it arrived)
        return { value: chunkOf(delta), done: false };
      }
      if (this._terminal) {
        const t = this._terminal;
        this._terminal = { consumed: true, error: t.error };
        if (!t.consumed) this.client._consumedEnd(this);
        if (t.error && !t.consumed) throw t.error;
        return { value: undefined, done: true };
      }
      await new Promise((resolve) => { this._waiter = resolve; });
    }
  }

  /** Called when a for-await loop is left early: cancels the stream on the server. */
  async return() {
    if (!this.finished) this.cancel();
    this._buffer.length = 0;
    this._terminal = { consumed: true, error: null };
    return { value: undefined, done: true };
  }

  /** The whole reply as a string (binary chunks are decoded as UTF-8). A tool call that the `tools` option does
   * not answer is a LowLatError (and cancels the stream): the model would wait for its answer. */
  async text() {
    let out = "";
    const decoder = new TextDecoder();
    for await (const chunk of this) {
      if (chunk instanceof ToolCall) {
        throw new LowLatError(`the model asked for tool ${JSON.stringify(chunk.name)}: pass tools: `
          + `{ ${JSON.stringify(chunk.name)}: fn } to answer it, or iterate the stream and answer with sendResult()`);
      }
      out += typeof chunk === "string" ? chunk : decoder.decode(chunk, { stream: true });
    }
    return out + decoder.decode();
  }

  // --------------------------------------------------------------------------- full-duplex (protocol v1.3)
  /**
   * Send the running model more input: a string, or bytes (a Uint8Array, an ArrayBuffer or a view); `end`: the
   * last of it. Inputs are numbered and kept until the stream ends: after a dropped connection the resume sends
   * again what the server lacks, so the model gets each exactly once. Resolves once it is sent or queued for the
   * connection; rejects with a LowLatError if the server is older than protocol v1.3 or the stream has ended.
   */
  send(item, { end = false } = {}) {
    if (typeof item === "string") return this._input({ text: item }, end);
    if (item instanceof Uint8Array) return this._input({ data: item }, end);
    if (item instanceof ArrayBuffer) return this._input({ data: new Uint8Array(item) }, end);
    if (ArrayBuffer.isView(item)) {
      return this._input({ data: new Uint8Array(item.buffer, item.byteOffset, item.byteLength) }, end);
    }
    return Promise.reject(new TypeError("send() takes a string or bytes"));
  }

  /** Answer the model's tool call `call` (a ToolCall, or its id) with `content` (a string, else sent as JSON
   * text); `isError`: the tool failed and `content` says how; `end`: no more input after it. */
  sendResult(call, content, { isError = false, end = false } = {}) {
    const id = call instanceof ToolCall ? call.id : call;
    if (typeof id !== "string") return Promise.reject(new TypeError("sendResult() takes a ToolCall or its id"));
    let text;
    try {
      text = resultText(content);
    } catch (error) {
      return Promise.reject(error);
    }
    const result = { id, content: text };
    if (isError) result.is_error = true;
    return this._input({ tool_result: result }, end);
  }

  /** No more input for this stream (the model's `async for item in req.inputs` ends). */
  endInput() {
    return this._input({}, true);
  }

  _input(item, end) {
    const add = async () => {
      const client = this.client;
      if (!client.welcome && !this.finished) await client.connect(); // the server's revision decides
      if (this.finished) throw new LowLatError(`stream ${this.id} has ended: it takes no more input`);
      const revision = client.welcome ? client.welcome.revision : 0;
      if (revision < DUPLEX_REVISION) {
        throw new LowLatError(`the server speaks protocol revision ${revision}: stream input needs v1.3`);
      }
      if (this._inputEnded) throw new LowLatError(`stream ${this.id}: its input was ended`);
      const msg = { type: "input", stream_id: this.id, seq: this._inputs.length + 1, ...item };
      if (end) { msg.end = true; this._inputEnded = true; }
      this._inputs.push(msg);
      client._flushInputs(this);
    };
    const p = this._inputTail.then(add, add); // in the order they were called, whatever waits for a connection
    this._inputTail = p.catch(() => {});
    return p;
  }

  /** Whether Delta `delta` is a tool call the stream's `tools` answer. */
  _answers(delta) {
    const call = delta.tool_call;
    return Boolean(call && this.tools && Object.hasOwn(this.tools, call.name)
      && typeof this.tools[call.name] === "function");
  }

  /** Answer `call` with the stream's own tool: its result (a string, else JSON), or its error with isError. */
  async _runTool(call) {
    let content;
    let isError = false;
    try {
      content = resultText(await this.tools[call.name](call.args, call));
    } catch (error) { // the tool failed: the model is told, and decides
      isError = true;
      content = error instanceof Error ? `${error.name}: ${error.message}` : `Error: ${String(error)}`;
    }
    if (this.finished) return;
    try {
      await this.sendResult(call, content, { isError });
    } catch { /* the stream ended meanwhile */ }
  }

  _wake() {
    const w = this._waiter;
    this._waiter = null;
    if (w) w();
  }

  _delivered(delta) {
    this.deliveredSeq = delta.seq;
    this.client._consumedDelta(this, delta);
  }

  _push(delta) {
    if (this._answers(delta)) this._runTool(delta.tool_call); // (at once, consumed or not: the model waits)
    if (this.callbacks.onDelta) {
      if (this._answers(delta)) {
        this._delivered(delta);
        return;
      }
      try {
        this.callbacks.onDelta(chunkOf(delta), delta);
      } finally {
        this._delivered(delta);
      }
    } else {
      this._buffer.push(delta);
      this._wake();
    }
  }

  _finish(end, error) {
    if (this.finished) return;
    this.finishedAt = performance.now();
    this.status = error ? "failed" : "done";
    this.end = end;
    this.error = error;
    this._inputs = []; // (the server takes no more input for it: nothing to send again)
    this._sentInputs = 0;
    if (error) this._reject(error);
    else this._resolve(end);
    if (this.callbacks.onDelta || this.callbacks.onEnd || this.callbacks.onError) {
      this._terminal = { consumed: true, error };
      if (end) this.client._consumedEnd(this);
      if (error && this.callbacks.onError) this.callbacks.onError(error);
      else if (end && this.callbacks.onEnd) this.callbacks.onEnd(end);
    } else {
      this._terminal = { consumed: false, error };
    }
    this._wake();
  }
}

// ----------------------------------------------------------------------------- pushes
/**
 * The server's pushes as they arrive, from `client.pushes()`: `for await (const push of client.pushes())`,
 * each a Push message `{type: "push", topic, text}` or `{type: "push", topic, data}` (a Uint8Array).
 * It holds at most `maxPushes` unread (past that the oldest is dropped and `dropped` counts it); it ends
 * when you leave the loop, when the `signal` given aborts or when the client is closed, and throws what
 * ended the connection (ConnectionClosedError: a final close code, or a drop after which nothing
 * reconnects; ReconnectFailedError) once the pushes that came before it are read.
 */
export class PushIterator {
  constructor(client, max, signal) {
    this.client = client;
    this.max = max;
    this.dropped = 0; // pushes dropped because `max` were waiting unread
    this._buffer = [];
    this._waiters = [];
    this._end = null; // {error} once over
    if (signal) {
      if (signal.aborted) this.return();
      else signal.addEventListener("abort", () => this.return(), { once: true });
    }
  }

  /** Whether it is over (no push will be added). */
  get finished() {
    return this._end !== null;
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  async next() {
    for (;;) {
      if (this._buffer.length) return { value: this._buffer.shift(), done: false };
      if (this._end) {
        const error = this._end.error;
        this._end.error = null; // thrown once; then done
        if (error) throw error;
        return { value: undefined, done: true };
      }
      await new Promise((resolve) => { this._waiters.push(resolve); });
    }
  }

  /** Stop listening (what a for-await loop left early calls). */
  async return() {
    this._finish(null);
    this._buffer.length = 0;
    return { value: undefined, done: true };
  }

  _put(push) {
    if (this._end) return;
    if (this._buffer.length >= this.max) {
      this._buffer.shift();
      this.dropped++;
    }
    this._buffer.push(push);
    this._wake();
  }

  _finish(error) {
    if (this._end) return;
    this._end = { error };
    this.client._pushIterators.delete(this);
    this._wake();
  }

  _wake() {
    const waiters = this._waiters.splice(0);
    for (const w of waiters) w();
  }
}

// ----------------------------------------------------------------------------- client
function defaultUrl(path = "/ws") {
  if (typeof location === "undefined") throw new LowLatError("give the client a URL (no page location here)");
  return `${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}${path}`;
}

/** ws:// and wss:// URLs as given; a path ("/ws") or http(s):// URL is turned into the page's ws(s) URL. */
function resolveUrl(url, path) {
  if (!url) return defaultUrl(path);
  const text = String(url);
  if (text.startsWith("/")) return defaultUrl(text);
  return text.replace(/^http(s?):/, "ws$1:");
}

/** Why a connection attempt failed, from its close event and the error event before it, as far as the runtime
 * tells: a browser says nothing; the `ws` package gives the answer to a refused handshake (`refusal`: its status,
 * and its text if short plain text) and the socket's error (its `code`, e.g. ECONNREFUSED: then `refused` is set). */
function attemptFailed(close, failure, refusal, url) {
  const error = failure && failure.error instanceof Error ? failure.error : null;
  const options = error ? { cause: error } : undefined;
  if (refusal && ![502, 503, 504].includes(refusal.status)) {
    const text = refusal.type.startsWith("text/plain") && refusal.body.length <= 500 ? refusal.body.trim() : "";
    return new HandshakeRefusedError(refusal.status, new URL(url).pathname, text, options);
  }
  const message = refusal ? `HTTP ${refusal.status}` : String((error && error.message) || (failure && failure.message) || "");
  const exc = new ConnectionClosedError(close.code, close.reason || message || "connection failed", options);
  exc.refused = Boolean(error && error.code === "ECONNREFUSED");
  return exc;
}

function frameSize(frame) {
  return typeof frame === "string" ? utf8Length(frame) : frame.byteLength;
}

function wsHeaderSize(payload, masked) {
  return (payload < 126 ? 2 : payload < 65536 ? 4 : 10) + (masked ? 4 : 0);
}

/**
 * A lowlat-mw connection carrying many concurrent streams; reconnects and resumes by itself.
 *
 * Events (it is an EventTarget; `client.on(type, fn)` returns an unsubscribe function):
 * - "statechange": detail {state, previous, resumed, code, reason, attempt, delay, error}
 * - "welcome": detail = the server's Welcome
 * - "goaway": detail = the GoAway message;  "servererror": detail = an Error on stream 0
 * - "message" / "send": detail {msg, bytes} for every frame received / sent (for inspection)
 * - "push": detail = a Push the server published to this client's session, user or one of its groups
 * - "warmupfailed": detail = the error of the `warmup` option's background warm-up (v1.2)
 *
 * States: "idle" (no connection; the next request opens one), "connecting", "connected",
 * "reconnecting" (after a drop, with backoff; streams are kept and resumed), "closed" (final: you
 * called close(), or the server closed with a code after which clients must not reconnect).
 */
export class LowLatClient extends EventTarget {
  constructor(url, options = {}) {
    super();
    if (url && typeof url === "object" && !(url instanceof URL)) { options = url; url = undefined; }
    this.url = resolveUrl(url, options.path);
    const mode = options.mode || "json";
    if (!options.codec && mode !== "json" && mode !== "proto") throw new RangeError('mode must be "json" or "proto"');
    this.codec = options.codec || (mode === "proto" ? protoCodec : jsonCodec);
    this.mode = this.codec.binary ? "proto" : "json";
    this.backoff = options.backoff instanceof Backoff ? options.backoff : new Backoff(options.backoff || {});
    this.resumeEnabled = options.resume !== false;
    this.flowWindow = options.flowWindow ?? 1024 * 1024;
    this.openTimeout = options.openTimeout ?? 10000;
    this.heartbeatTimeout = options.heartbeatTimeout ?? 10000;
    this.heartbeatInterval = options.heartbeatInterval ?? null; // ms; default: Welcome.heartbeat_interval_ms
    this.keepAlive = Boolean(options.keepAlive);
    this.maxPushes = options.maxPushes ?? 1000;
    // {text | messages | data, model, params}: a warm-up request sent whenever a connection starts a new session.
    this.warmupRequest = options.warmup ?? null;
    this.warmups = 0; // warm-up requests the server ran
    this.history = Boolean(options.history); // v1.3: the server keeps this session's turns (for `continues`)
    this.documents = new Map(); // v1.3: context documents, by name (sent again to a session without them)
    this._dropped = new Map(); // the last version of each document dropped, by name
    this.auth = options.auth || "";
    this.clientName = options.clientName || CLIENT_NAME;
    this.WebSocket = options.WebSocket || globalThis.WebSocket;

    this.state = "idle";
    this.resumed = false; // whether the current connection continues a dropped session
    this.welcome = null;
    this.goaway = null;
    this.lastClose = null; // {code, reason} of the last closed connection
    this.lastError = null; // the last Error on stream 0
    this.finalError = null;
    this.connections = 0;
    this.resumes = 0;
    this.rtt = null; // ms, from the last Pong
    this.stats = { framesIn: 0, framesOut: 0, bytesIn: 0, bytesOut: 0, wireIn: 0, wireOut: 0 };
    this.streams = new Map(); // sent and not finished: listed in a resume
    this.groups = new Set(); // push groups joined: joined again on a connection to a new session
    this._subscribing = new Map(); // Subscribe id -> {resolve, reject, timer}, until its Subscribed
    this._subIds = 1;
    this._pushIterators = new Set();
    this._queue = []; // streams waiting for a connection
    this._ids = 1;
    this._pingIds = 2 ** 31;
    this._pings = new Map();
    this._ws = null;
    this._connecting = null;
    this._userClosed = false;
    this._heartbeatTimer = null;
    this._wakeSleep = null;
    this._onOnline = () => { if (this._wakeSleep) this._wakeSleep(); };
    if (typeof addEventListener === "function") addEventListener("online", this._onOnline);
  }

  /** Subscribe to an event; returns the function that unsubscribes. */
  on(type, fn) {
    const listener = (event) => fn(event.detail, event);
    this.addEventListener(type, listener);
    return () => this.removeEventListener(type, listener);
  }

  _emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  _setState(state, extra = {}) {
    const previous = this.state;
    this.state = state;
    if (state !== previous || extra.resumed !== undefined || extra.attempt !== undefined) {
      this._emit("statechange", { state, previous, resumed: this.resumed, ...extra });
    }
  }

  /** True while a WebSocket is open and welcomed. */
  get connected() {
    return this.state === "connected" && this._ws !== null;
  }

  /** Connect now (with backoff retries) unless connected; resolves once the server's Welcome arrived. */
  connect() {
    if (this._userClosed) return Promise.reject(new LowLatError("client is closed"));
    if (this.finalError) return Promise.reject(this.finalError);
    if (this.connected) return Promise.resolve(this.welcome);
    return this._beginConnect(false);
  }

  /**
   * Start a stream. `input` is the prompt text, or an object {text | messages | data, model, params}.
   * Options: model, params, and callbacks onDelta(chunk, delta), onEnd(end), onError(error)
   * (without callbacks, iterate the returned Stream); `tools` (v1.3): {name: fn}, the model's calls of these
   * tools are answered by the stream itself as they arrive, with `await fn(call.args, call)` (a string, else
   * sent as JSON; a thrown error is sent as "Name: message" with isError), and are not yielded.
   */
  stream(input, options = {}) {
    return this._stream(input, options, false);
  }

  _stream(input, options, warmup) {
    if (this._userClosed) throw new LowLatError("client is closed");
    if (input && typeof input === "object" && !(input instanceof Uint8Array)) {
      options = { ...input, ...options };
      input = undefined;
    }
    const request = { type: "request", stream_id: this._ids++, model: options.model || "" };
    if (warmup) request.warmup = true;
    if (typeof input === "string") request.text = input;
    else if (input instanceof Uint8Array) request.data = input;
    if (options.text !== undefined) request.text = options.text;
    if (options.data !== undefined) request.data = options.data;
    if (options.messages !== undefined) request.messages = options.messages;
    request.params = options.params || {};
    if (options.context && options.context.length) { // (v1.3)
      request.contexts = options.context.map((d) => (d instanceof ContextDocument ? d.name : String(d)));
    }
    if (options.continues) {
      if (!this.history) throw new LowLatError("continues needs a client made with { history: true }");
      request.continues = options.continues instanceof Stream ? options.continues.id : options.continues;
    }
    const { onDelta, onEnd, onError } = options;
    const stream = new Stream(this, request, { onDelta, onEnd, onError }, options.tools);
    if (this.finalError) {
      stream._finish(null, this.finalError);
      return stream;
    }
    this._start(stream);
    if (options.signal) {
      if (options.signal.aborted) stream.cancel();
      else options.signal.addEventListener("abort", () => stream.cancel(), { once: true });
    }
    return stream;
  }

  /** Run a request and return the whole reply as text. */
  complete(input, options = {}) {
    return this.stream(input, options).text();
  }

  /**
   * Have the server run the model's warm-up hook for this input (`input` and options as for `stream()`) and
   * resolve when it has, with the server's End (finish_reason "warmup", no Delta before it; timings_ms.total:
   * how long it took), so that the first real request finds the model ready. Connects first if need be.
   * Protocol v1.2: against an older server nothing is sent and it resolves with null (such a server would
   * run the model as a plain request). A failing hook rejects with a StreamError (model_error).
   */
  async warmup(input, options = {}) {
    if (!this.connected) await this.connect();
    if (!this._speaksWarmup()) return null;
    const stream = this._stream(input, options, true);
    try {
      await stream.text();
    } catch (error) {
      if (error instanceof LowLatError && error.noWarmup) return null; // a resend met an older server
      throw error;
    }
    if (!stream.end || stream.end.finish_reason !== "warmup") return null;
    this.warmups++;
    return stream.end;
  }

  _speaksWarmup() {
    return Boolean(this.welcome && this.welcome.revision >= WARMUP_REVISION);
  }

  /**
   * The session's context document `name` with `text` as its whole text (protocol v1.3; sent now, connecting
   * first if need be): a ContextDocument to patch and to name in `stream(q, { context: [doc] })`. Rejects if the
   * server is older than v1.3.
   */
  async context(name, text = "") {
    if (!this.connected) await this.connect();
    if (!(this.welcome.revision >= CONTEXT_REVISION)) {
      throw new LowLatError(`the server speaks protocol revision ${this.welcome.revision}: it has no context documents`);
    }
    let doc = this.documents.get(name);
    if (!doc) {
      doc = new ContextDocument(this, name);
      doc.version = this._dropped.get(name) ?? 0; // (versions go on past a dropped one: its answers are old)
      this._dropped.delete(name);
      this.documents.set(name, doc);
    }
    doc.set(text);
    return doc;
  }

  _sendContext(msg) {
    // Without a connection it waits: the next Welcome says which version the session holds, and what to resend.
    if (this.connected && this.welcome.revision >= CONTEXT_REVISION) this._send(msg);
  }

  /** Send a protocol Ping and resolve with the round-trip time to its Pong in milliseconds. */
  async ping(timeout = 5000) {
    if (!this.connected) await this.connect();
    const id = this._pingIds++ >>> 0;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => { this._pings.delete(id); reject(new LowLatError("no Pong in time")); }, timeout);
      this._pings.set(id, { sent: performance.now(), resolve, timer });
      this._send({ type: "ping", id });
    });
  }

  /** Close the connection for good; streams still running fail with ConnectionClosedError(1000). */
  close(code = 1000, reason = "") {
    if (this._userClosed) return;
    this._userClosed = true;
    if (typeof removeEventListener === "function") removeEventListener("online", this._onOnline);
    if (this._wakeSleep) this._wakeSleep();
    const ws = this._ws;
    this._detach();
    if (ws) {
      try { ws.close(code, reason); } catch { /* already closing */ }
    }
    this._failAll(new ConnectionClosedError(code, reason || "closed by the client"));
    this._rejectSubscribes(new ConnectionClosedError(code, reason || "closed by the client"));
    this._endPushes(null);
    this._setState("closed", { code, reason });
  }

  // --------------------------------------------------------------------------- push (protocol v1.1)
  /**
   * Join push group `group`: once this resolves, what the server publishes to `group:<name>` arrives as
   * "push" events and in `pushes()`. The client joins its groups again whenever it reconnects to a new
   * session, and reconnects on its own after a drop while it is in a group. Rejects with a StreamError if
   * the server refuses (`unauthorized`: not in its push_groups; `bad_request`), with a LowLatError if the
   * server speaks protocol v1.0 or no answer came within `timeout` ms, with a ConnectionClosedError if the
   * connection closed first.
   */
  async subscribe(group, timeout = 10000) {
    await this._membership(group, false, timeout);
    this.groups.add(group);
  }

  /** Leave push group `group` (nothing to do on a closed client). */
  async unsubscribe(group, timeout = 10000) {
    this.groups.delete(group);
    if (this._userClosed || this.finalError) return;
    await this._membership(group, true, timeout);
  }

  /** The pushes from now on, as an async iterator (a PushIterator); `signal` (an AbortSignal) ends it. */
  pushes({ signal } = {}) {
    const it = new PushIterator(this, Math.max(1, this.maxPushes), signal);
    if (this._userClosed) it._finish(null);
    else if (this.finalError) it._finish(this.finalError);
    else if (!it.finished) this._pushIterators.add(it);
    return it;
  }

  async _membership(group, leave, timeout) {
    if (typeof group !== "string") throw new TypeError("a push group's name is a string");
    if (!this.connected) await this.connect();
    if (!(this.welcome.revision >= 1)) {
      throw new LowLatError(`the server at ${this.url} speaks protocol v1.0: it has no push groups`);
    }
    const id = this._subIds++ >>> 0;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this._subscribing.delete(id);
        reject(new LowLatError(`no answer to Subscribe ${JSON.stringify(group)} within ${timeout} ms`));
      }, timeout);
      this._subscribing.set(id, { resolve, reject, timer });
      if (!this._send({ type: "subscribe", id, group, leave })) {
        this._subscribing.delete(id);
        clearTimeout(timer);
        reject(new ConnectionClosedError(this.lastClose ? this.lastClose.code : null, "not connected"));
      }
    });
  }

  _rejectSubscribes(error) {
    const pending = [...this._subscribing.values()];
    this._subscribing.clear();
    for (const p of pending) {
      clearTimeout(p.timer);
      p.reject(error);
    }
  }

  _endPushes(error) {
    for (const it of [...this._pushIterators]) it._finish(error);
  }

  // --------------------------------------------------------------------------- connecting
  _sleep(ms) {
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      const self = this;
      function done() { clearTimeout(timer); if (self._wakeSleep === done) self._wakeSleep = null; resolve(); }
      this._wakeSleep = done;
    });
  }

  /** Start connecting unless a connect is running; `resume`: after a drop ("reconnecting"). */
  _beginConnect(resume, waitMs = 0) {
    if (this._connecting) return this._connecting;
    const p = (async () => {
      if (waitMs) await this._sleep(waitMs);
      return this._connectWithRetries(resume);
    })();
    this._connecting = p;
    p.then(() => {}, () => {}).then(() => { if (this._connecting === p) this._connecting = null; });
    return p;
  }

  async _connectWithRetries(resume) {
    let attempt = 0;
    let error = null;
    try {
      if (typeof (this.WebSocket || globalThis.WebSocket) !== "function") throw new NoWebSocketError();
      for (;;) {
        if (this._userClosed) throw new LowLatError("client is closed");
        this._setState(resume ? "reconnecting" : "connecting", { attempt });
        try {
          const welcome = await this._openOnce();
          this._flushQueue();
          return welcome;
        } catch (exc) {
          error = exc;
          if (exc instanceof ConnectionClosedError && !exc.reconnect) throw exc;
          if (exc instanceof StreamError) throw exc;
          // A first connection refused: nothing listens there (a reconnect waits for a restart with its backoff).
          if (exc.refused && this.connections === 0) throw new ReconnectFailedError(this.url, attempt + 1, exc);
        }
        if (attempt >= this.backoff.retries) throw new ReconnectFailedError(this.url, attempt + 1, error);
        const delay = this.backoff.delay(attempt) * 1000;
        this._setState(resume ? "reconnecting" : "connecting", { attempt: attempt + 1, delay, error });
        await this._sleep(delay);
        attempt++;
      }
    } catch (exc) {
      if (!this._userClosed) {
        // (a refused handshake is not for good: the server's configuration, or the URL, may change)
        const final = (exc instanceof ConnectionClosedError && !(exc instanceof HandshakeRefusedError))
          || exc instanceof StreamError;
        if (final) {
          this.finalError = exc instanceof ConnectionClosedError ? exc
            : new ConnectionClosedError(1008, exc.message, { cause: exc });
        }
        this._failAll(final ? this.finalError : exc);
        this._endPushes(final ? this.finalError : exc);
        this._setState(final ? "closed" : "idle", { error: exc });
      }
      throw exc;
    }
  }

  /** One connection attempt: open, Hello (resuming the open streams, or the session's push groups, if any), Welcome. */
  _openOnce() {
    const resume = Boolean(this.resumeEnabled && (this.streams.size > 0 || this.groups.size > 0) && this.welcome
      && this.welcome.resume_token);
    return new Promise((resolve, reject) => {
      let ws;
      try {
        const WebSocketImpl = this.WebSocket || globalThis.WebSocket;
        ws = new WebSocketImpl(this.url, this.codec.binary ? [SUBPROTOCOL_PROTO] : [SUBPROTOCOL_JSON]);
      } catch (exc) {
        reject(exc);
        return;
      }
      ws.binaryType = "arraybuffer";
      let settled = false;
      const fail = (exc) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        ws.onopen = ws.onmessage = ws.onclose = ws.onerror = null;
        try { ws.close(); } catch { /* not open */ }
        reject(exc);
      };
      const timer = setTimeout(() => fail(new LowLatError("timed out opening the connection")), this.openTimeout);
      let failure = null;
      let refusal = null;
      ws.onerror = (event) => { failure = event; }; // the close event follows; this may say more (not in a browser)
      ws.onclose = (event) => fail(attemptFailed(event, failure, refusal, this.url));
      if (typeof ws.on === "function") { // the `ws` package (Node): what a refused handshake's answer says
        ws.on("unexpected-response", (request, response) => {
          let body = "";
          response.setEncoding("utf8");
          response.on("data", (text) => { if (body.length <= 500) body += text; });
          const done = () => {
            refusal = { status: response.statusCode, type: String(response.headers["content-type"] || ""), body };
            ws.terminate(); // (then its error and close events, as without this listener)
          };
          response.on("end", done);
          response.on("error", done);
        });
      }
      ws.onopen = () => {
        const chosen = ws.protocol || SUBPROTOCOL_JSON;
        if (chosen !== this.codec.subprotocol) {
          fail(new ConnectionClosedError(1002, `server chose subprotocol ${chosen}`));
          return;
        }
        const hello = { type: "hello", client: this.clientName, compression: [], flow_window: this.flowWindow,
          auth: this.auth, resume_token: "", last_seq: {}, revision: PROTOCOL_REVISION };
        if (this.history) hello.history = true; // (v1.3)
        if (resume) {
          hello.resume_token = this.welcome.resume_token;
          for (const [sid, s] of this.streams) hello.last_seq[sid] = s.receivedSeq;
        }
        this._sendOn(ws, hello);
      };
      ws.onmessage = (event) => {
        let msg;
        try {
          msg = this.codec.decode(event.data);
        } catch (exc) {
          fail(new ConnectionClosedError(1007, String(exc.message || exc)));
          return;
        }
        this._countIn(event.data);
        if (msg.type === "error") {
          fail(new StreamError(msg));
          return;
        }
        if (msg.type !== "welcome") {
          fail(new ConnectionClosedError(1002, `expected welcome, got ${msg.type}`));
          return;
        }
        if (this._userClosed) {
          fail(new LowLatError("client is closed"));
          return;
        }
        settled = true;
        clearTimeout(timer);
        this._attach(ws, msg, resume);
        resolve(msg);
      };
    });
  }

  _attach(ws, welcome, resume) {
    const hadToken = this.welcome && this.welcome.resume_token;
    this._ws = ws;
    this.welcome = welcome;
    this.goaway = null;
    this.connections++;
    this.resumed = Boolean(welcome.resumed);
    if (this.resumed) this.resumes++;
    const have = (this.resumed && welcome.input_seq) || {};
    for (const s of this.streams.values()) s._sentInputs = have[s.id] ?? 0; // (v1.3) the server has these
    ws.onmessage = (event) => this._onMessage(ws, event);
    ws.onclose = (event) => this._onClose(ws, event.code, event.reason);
    ws.onerror = () => {};
    this._lastReceived = performance.now();
    this._pingOutstanding = null;
    const interval = this.heartbeatInterval ?? (welcome.heartbeat_interval_ms || 30000);
    const every = Math.max(100, Math.min(1000, interval / 2));
    this._heartbeatTimer = setInterval(() => this._heartbeat(ws, interval), every);
    if (this.documents.size && welcome.revision >= CONTEXT_REVISION) {
      // (v1.3) Before the queued requests: the whole text of each document the session does not hold at its version.
      const held = this.resumed ? (welcome.contexts || {}) : {};
      for (const doc of this.documents.values()) {
        const again = doc._welcomed(held);
        if (again) this._sendOn(ws, again);
      }
    }
    this._emit("welcome", welcome);
    this._setState("connected", { resumed: this.resumed, resume: Boolean(resume && hadToken) });
    if (this.resumed && this._ws === ws) {
      for (const s of [...this.streams.values()]) this._flushInputs(s); // (v1.3) the Inputs the server lacks
    }
    if (this.warmupRequest && !this.resumed && welcome.revision >= WARMUP_REVISION && this._ws === ws) {
      // A new session (maybe on another server process): warm the model up in the background, only a hint, after
      // the requests queued while connecting (sent as this connection's Welcome is taken), so it never goes first.
      setTimeout(() => {
        if (this._ws === ws) this.warmup(this.warmupRequest).catch((error) => this._emit("warmupfailed", error));
      }, 0);
    }
    if (this.groups.size && welcome.revision >= 1 && this._ws === ws) {
      // A new session is in no group yet; a resumed one in another process may have missed the last join (written
      // there 10 ms after its answer). Join the client's groups again: it changes nothing where it is in them.
      for (const group of [...this.groups].sort()) {
        this._send({ type: "subscribe", id: this._subIds++ >>> 0, group, leave: false });
      }
    }
  }

  _detach() {
    clearInterval(this._heartbeatTimer);
    this._heartbeatTimer = null;
    const ws = this._ws;
    this._ws = null;
    if (ws) ws.onmessage = ws.onclose = ws.onerror = null;
  }

  // --------------------------------------------------------------------------- I/O
  _countIn(frame) {
    const n = frameSize(frame);
    this.stats.framesIn++;
    this.stats.bytesIn += n;
    this.stats.wireIn += n + wsHeaderSize(n, false);
    return n + wsHeaderSize(n, false);
  }

  _sendOn(ws, msg) {
    const frame = this.codec.encode(msg);
    ws.send(frame);
    const n = frameSize(frame);
    this.stats.framesOut++;
    this.stats.bytesOut += n;
    this.stats.wireOut += n + wsHeaderSize(n, true);
    this._emit("send", { msg, bytes: n });
  }

  /** Send on the open connection; false if there is none (the message is dropped). */
  _send(msg) {
    const ws = this._ws;
    if (!ws || ws.readyState !== 1) return false;
    this._sendOn(ws, msg);
    return true;
  }

  _heartbeat(ws, interval) {
    if (ws !== this._ws) return;
    const now = performance.now();
    const out = this._pingOutstanding;
    if (out && out.at <= this._lastReceived) this._pingOutstanding = null;
    if (this._pingOutstanding) {
      if (now - this._pingOutstanding.at > this.heartbeatTimeout) {
        // The server stopped answering: give the connection up and reconnect.
        this._detach();
        try { ws.close(4001, "server did not answer"); } catch { /* closing */ }
        this._onClose(ws, 4001, "server did not answer", true);
      }
      return;
    }
    if (now - this._lastReceived >= interval) {
      const id = this._pingIds++ >>> 0;
      this._pingOutstanding = { id, at: now };
      this._pings.set(id, { sent: now, resolve: null, timer: null });
      this._send({ type: "ping", id });
    }
  }

  _onMessage(ws, event) {
    if (ws !== this._ws) return;
    let msg;
    try {
      msg = this.codec.decode(event.data);
    } catch (exc) {
      this._detach();
      try { ws.close(1007, "undecodable frame"); } catch { /* closing */ }
      this._onClose(ws, 1007, String(exc.message || exc), true);
      return;
    }
    const wire = this._countIn(event.data);
    this._lastReceived = performance.now();
    this._emit("message", { msg, bytes: wire });
    switch (msg.type) {
      case "delta": {
        const s = this.streams.get(msg.stream_id);
        if (!s) return;
        s.wireBytes += wire;
        if (msg.seq <= s.receivedSeq) return; // replayed after a resume: already have it
        if (msg.seq !== s.receivedSeq + 1) {
          this.streams.delete(s.id);
          s._finish(null, new LowLatError(`stream ${s.id}: got seq ${msg.seq} after ${s.receivedSeq}`));
          return;
        }
        s.receivedSeq = msg.seq;
        s.deltas++;
        s.rawBytes += chunkSize(msg);
        if (s.firstDeltaAt === null) s.firstDeltaAt = performance.now();
        s.status = "streaming";
        s._push(msg);
        return;
      }
      case "end":
      case "error": {
        if (!msg.stream_id) {
          if (msg.type === "error") { this.lastError = msg; this._emit("servererror", msg); }
          return;
        }
        const s = this.streams.get(msg.stream_id);
        if (!s) return;
        s.wireBytes += wire;
        this.streams.delete(s.id);
        if (msg.type === "end" && msg.finish_reason === "cancelled" && !s._cancelled) {
          // Stopped by the server (an older one, force-stopped), not at our asking: a cut stream, never a normal end.
          s._finish(null, new StreamError({ code: "internal", retryable: true, stream_id: s.id,
            message: `the server cancelled stream ${s.id} after ${msg.last_seq} deltas, unasked: its output is incomplete` }));
          return;
        }
        if (msg.type === "end") { s._finish(msg, null); return; }
        if (msg.code === "resume_failed" && msg.retryable && s.receivedSeq === 0
            && s.resends < Math.max(1, this.backoff.retries)) {
          s.resends++; // the server never saw this Request (lost in the drop): send it again
          this._start(s);
          return;
        }
        if (msg.code === "context_mismatch" && msg.retryable && s.receivedSeq === 0 && !s._contextResent
            && !s.request.continues) {
          s._contextResent = true; // a document the server lost: its whole text went out ahead of this resend
          this._start(s);
          return;
        }
        if (msg.code === "draining" && msg.retryable && s.receivedSeq === 0 && !s._drainResent) {
          s._drainResent = true; // the server is going away: resend on the next connection
          s._sent = false;
          this._queue.push(s);
          return;
        }
        if (msg.code === "resume_failed" && msg.retryable && s.receivedSeq === 0) {
          // Sent again after each drop, never received: say so (not "unknown to this session").
          msg = { ...msg, message: `stream ${s.id}: the request was not delivered: the server never received it, `
            + `though it was sent ${1 + s.resends} times and the connection dropped each time (a message larger than `
            + "the server or a proxy takes is dropped so)" };
        }
        s._finish(null, msg.code === "resume_failed" ? new ResumeFailedError(msg) : new StreamError(msg));
        return;
      }
      case "ping":
        this._send({ type: "pong", id: msg.id });
        return;
      case "pong": {
        const p = this._pings.get(msg.id);
        if (!p) return;
        this._pings.delete(msg.id);
        this.rtt = performance.now() - p.sent;
        if (p.timer) clearTimeout(p.timer);
        if (p.resolve) p.resolve(this.rtt);
        return;
      }
      case "goaway":
        this.goaway = msg;
        this._emit("goaway", msg);
        return;
      case "push":
        if (typeof msg.text !== "string" && !(msg.data instanceof Uint8Array)) return; // (neither: malformed)
        for (const it of this._pushIterators) it._put(msg);
        this._emit("push", msg);
        return;
      case "context_ack": { // (v1.3)
        const doc = this.documents.get(msg.name);
        const again = doc ? doc._answered(msg) : null;
        if (again) this._send(again);
        return;
      }
      case "subscribed": {
        const p = this._subscribing.get(msg.id);
        if (!p) return; // (a group joined again after a reconnect: not awaited)
        this._subscribing.delete(msg.id);
        clearTimeout(p.timer);
        if (msg.code && msg.code !== "unspecified") p.reject(new StreamError({ code: msg.code, message: msg.message }));
        else p.resolve();
        return;
      }
      default:
        return; // unknown kinds are ignored (forward compatible)
    }
  }

  _onClose(ws, code, reason, local = false) {
    if (ws !== this._ws && !local) return;
    this._detach();
    this.lastClose = { code, reason };
    for (const [id, p] of this._pings) {
      if (p.timer) clearTimeout(p.timer);
      this._pings.delete(id);
    }
    this._rejectSubscribes(new ConnectionClosedError(code, reason || "closed before the Subscribe was answered"));
    if (this._userClosed) return;
    if (!closeCodeReconnects(code)) {
      this.finalError = new ConnectionClosedError(code, reason);
      this._failAll(this.finalError);
      this._endPushes(this.finalError);
      this._setState("closed", { code, reason });
      return;
    }
    const goaway = this.goaway;
    this.goaway = null;
    const canResume = this.resumeEnabled && this.streams.size > 0 && this.welcome && this.welcome.resume_token;
    if (!canResume) {
      for (const s of [...this.streams.values()]) {
        this.streams.delete(s.id);
        s._finish(null, new ConnectionClosedError(code, reason || "connection lost during the stream"));
      }
    }
    // In push groups: reconnect too, to go on listening (a new session joins the groups again).
    const listening = this.resumeEnabled && this.groups.size > 0;
    const eager = canResume || listening || this._queue.length > 0
      || (this.keepAlive && canonicalCloseCode(code) !== 4000);
    if (!eager) this._endPushes(new ConnectionClosedError(code, reason || "connection lost")); // (nothing comes now)
    this._setState(eager ? "reconnecting" : "idle", { code, reason });
    if (eager) this._beginConnect(true, goaway ? goaway.reconnect_after_ms : 0).catch(() => {});
  }

  // --------------------------------------------------------------------------- streams
  _start(stream) {
    if (this.connected && !this.goaway) {
      this._sendRequest(stream);
      return;
    }
    this._queue.push(stream);
    if (!this._connecting && !this.goaway) this.connect().catch(() => {});
  }

  _sendRequest(stream) {
    if (stream.request.warmup && !this._speaksWarmup()) {
      // Checked here, where every (re)send goes: a resend after a drain or a lost Request may meet an older server,
      // which would ignore the flag and run the model.
      this.streams.delete(stream.id);
      const error = new LowLatError(`the server speaks protocol revision ${this.welcome ? this.welcome.revision : 0}: `
        + "it has no warm-up");
      error.noWarmup = true;
      stream._finish(null, error);
      return;
    }
    if ((stream.request.contexts || stream.request.continues) && !(this.welcome.revision >= CONTEXT_REVISION)) {
      this.streams.delete(stream.id); // (checked at every send: a resend may meet an older server)
      stream._finish(null, new LowLatError(`the server speaks protocol revision ${this.welcome.revision}: `
        + "it has no context documents and no continues"));
      return;
    }
    stream._sent = true;
    this.streams.set(stream.id, stream);
    stream.startedAt ??= performance.now();
    this._send(stream.request); // if the connection just died, the resume lists the stream
    if (stream._inputs.length) {
      stream._sentInputs = 0; // (v1.3) a Request sent (again): the server has none of its Inputs
      this._flushInputs(stream);
    }
  }

  /** (v1.3) Send `stream`'s Inputs the server does not have yet, in order, after its Request; what does not go out
   * (no open connection) waits for the next Welcome, whose input_seq says where to go on. */
  _flushInputs(stream) {
    if (!stream._sent || stream.finished || this.streams.get(stream.id) !== stream) return;
    while (stream._sentInputs < stream._inputs.length) {
      if (!this._send(stream._inputs[stream._sentInputs])) return;
      stream._sentInputs++;
    }
  }

  _flushQueue() {
    const queue = this._queue.splice(0);
    for (const s of queue) if (!s.finished) this._sendRequest(s);
  }

  _failAll(error) {
    const all = [...this.streams.values(), ...this._queue.splice(0)];
    this.streams.clear();
    for (const s of all) s._finish(null, error);
  }

  _cancel(stream) {
    if (stream.finished) return;
    stream._cancelled = true; // (its End "cancelled" is then the answer, not a cut stream)
    const queued = this._queue.indexOf(stream);
    if (queued >= 0) {
      this._queue.splice(queued, 1);
      stream._finish({ type: "end", stream_id: stream.id, last_seq: 0, finish_reason: "cancelled", timings_ms: {},
        usage: {} }, null);
      return;
    }
    const sent = stream._sent && this._send({ type: "cancel", stream_id: stream.id });
    if (stream._sent && !sent && this.streams.get(stream.id) === stream) {
      // No connection (reconnecting): the next resume leaves this stream out, which cancels it.
      this.streams.delete(stream.id);
      stream._finish({ type: "end", stream_id: stream.id, last_seq: stream.receivedSeq, finish_reason: "cancelled",
        timings_ms: {}, usage: {} }, null);
    }
  }

  _consumedDelta(stream, delta) {
    const window = this.welcome ? this.welcome.flow_window : 0;
    if (!window) return;
    stream._unacked += chunkSize(delta) + 64;
    if (stream._unacked >= window / 4
        && this._send({ type: "ack", stream_id: stream.id, seq: delta.seq, done: false })) {
      stream._unacked = 0;
    }
  }

  _consumedEnd(stream) {
    if (this.welcome && this.welcome.flow_window) {
      this._send({ type: "ack", stream_id: stream.id, seq: stream.receivedSeq, done: true });
    }
  }
}

/** `new LowLatClient(url, options)` and connect it; resolves with the client once welcomed. */
export async function connect(url, options) {
  const client = new LowLatClient(url, options);
  await client.connect();
  return client;
}
