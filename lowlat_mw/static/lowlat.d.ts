// Type declarations of lowlat.js, the lowlat-mw browser client (docs/browser.md). Hand-written beside the
// module; tests/test_npm_package.py type-checks a program against them with TypeScript (strict).

export declare const VERSION: string;
export declare const SUBPROTOCOL_JSON: "lowlat.v1.json";
export declare const SUBPROTOCOL_PROTO: "lowlat.v1.proto";
/** The protocol revision the client implements (its Hello's `revision`): 3 is v1.3 (full-duplex streams, context),
 * 2 is v1.2 (warm-up), 1 is v1.1 (push). */
export declare const PROTOCOL_REVISION: 3;
/** The revision that brought warm-up requests: `warmup()` sends one only to a server of at least this one. */
export declare const WARMUP_REVISION: 2;
/** The revision that brought full-duplex streams: a stream's `send()`, `sendResult()` and `endInput()` need a server
 * of at least this one. */
export declare const DUPLEX_REVISION: 3;
/** The revision that brought context documents and `continues`: used only with a server of at least this one. */
export declare const CONTEXT_REVISION: 3;
/** What each close code means (docs/protocol.md section 12). */
export declare const CLOSE_CODES: Readonly<Record<number, string>>;
/** 4101-4199 are aliases of 1001-1099: the canonical code. */
export declare function canonicalCloseCode(code: number): number;
/** Whether a connection closed with `code` is worth reconnecting (and resuming). */
export declare function closeCodeReconnects(code: number): boolean;
/** Bytes of `s` in UTF-8. */
export declare function utf8Length(s: string): number;
/** SHA-256 of `bytes` (32 bytes), synchronous. */
export declare function sha256(bytes: Uint8Array): Uint8Array;

export type ErrorCodeName =
  | "unspecified" | "bad_request" | "model_error" | "too_many_streams" | "stream_id_in_use" | "protocol_error"
  | "invalid_payload" | "message_too_big" | "unsupported_compression" | "unsupported_message" | "resume_failed"
  | "rate_limited" | "unauthorized" | "internal" | "draining" | "unknown_model" | "context_mismatch"
  | "context_limit";

export declare class LowLatError extends Error {
  constructor(message?: string, options?: { cause?: unknown });
}
/** The server's Error for one stream (or the connection). */
export declare class StreamError extends LowLatError {
  constructor(fields?: { code?: ErrorCodeName; message?: string; stream_id?: number; retryable?: boolean });
  code: ErrorCodeName;
  serverMessage: string;
  streamId: number;
  retryable: boolean;
}
/** A dropped stream could not be resumed (the server no longer had it). */
export declare class ResumeFailedError extends StreamError {}
/** The connection closed for good (a final close code, or close() was called). */
export declare class ConnectionClosedError extends LowLatError {
  constructor(code: number | null, reason?: string, options?: { cause?: unknown });
  code: number | null;
  rawCode: number | null;
  reason: string;
  meaning: string;
  reconnect: boolean;
}
/** The handshake was answered with HTTP `status` (where the WebSocket implementation tells it: Node's `ws` package;
 * never a browser). `reason`: the answer's text (lowlat-mw names the check that refused), else the message has a hint.
 * Not retried. */
export declare class HandshakeRefusedError extends ConnectionClosedError {
  constructor(status: number, path?: string, reason?: string, options?: { cause?: unknown });
  status: number;
  path: string;
}
/** What HTTP `status` answering a WebSocket handshake for `path` most likely means. */
export declare function refusalHint(status: number, path: string): string;
/** Every connection attempt failed (`cause`: the last failure), or the first connection was refused (nothing listens:
 * where the runtime tells, as Node's `ws` does). */
export declare class ReconnectFailedError extends LowLatError {
  constructor(url: string, attempts: number, cause?: unknown);
  attempts: number;
}
/** No WebSocket: the runtime has none (Node.js before 22) and no `WebSocket` option was given. Not retried. */
export declare class NoWebSocketError extends LowLatError {
  constructor();
}

export interface BackoffOptions {
  /** Seconds before the first retry (the ceiling of its jitter). Default 1. */
  base?: number;
  factor?: number;
  /** Longest wait, seconds. Default 30. */
  cap?: number;
  retries?: number;
  jitter?: boolean;
  random?: () => number;
}
/** Exponential backoff with full jitter: delay n is uniform in [0, min(cap, base * factor ** n)] seconds. */
export declare class Backoff {
  constructor(options?: BackoffOptions);
  base: number;
  factor: number;
  cap: number;
  retries: number;
  jitter: boolean;
  random: () => number;
  ceiling(attempt: number): number;
  /** Seconds to wait before retry number `attempt`. */
  delay(attempt: number): number;
}

export interface ChatMessage { role: string; content: string }

/** A protocol message as the codecs give and take it: a `type` and the fields of docs/protocol.md. */
export interface Message { type: string; [field: string]: unknown }
export interface Welcome extends Message {
  type: "welcome";
  session_id: string;
  resume_token: string;
  compression: string[];
  max_frame_size: number;
  max_decompressed_size: number;
  max_streams: number;
  heartbeat_interval_ms: number;
  idle_timeout_ms: number;
  server: string;
  resumed: boolean;
  resume_window_ms: number;
  flow_window: number;
  /** The protocol revision the server implements: 0 is v1.0 (no push), 1 is v1.1, 2 is v1.2, 3 is v1.3. */
  revision: number;
  /** (v1.3) On a resumed Welcome: stream id -> seq of the last Input the server holds for it ({} otherwise). */
  input_seq: Record<number, number>;
  /** v1.3: the context documents a resumed session holds, name -> version ({} otherwise). */
  contexts: Record<string, number>;
}
/** v1.3: the server's answer to a document change; `code` other than "unspecified": refused. */
export interface ContextAck extends Message {
  type: "context_ack";
  name: string;
  version: number;
  code: ErrorCodeName;
  message: string;
}
/** The model asks the client to run tool `name` (v1.3): a stream's chunk; answer it with `stream.sendResult()`. */
export declare class ToolCall {
  constructor(fields?: { id?: string; name?: string; arguments?: string });
  /** Names the call: the answer carries it. */
  readonly id: string;
  readonly name: string;
  /** The call's arguments as JSON text. */
  readonly arguments: string;
  /** `arguments` parsed (null if empty or not JSON). */
  readonly args: unknown;
}
export interface Delta extends Message {
  type: "delta";
  stream_id: number;
  seq: number;
  /** Exactly one of text, data and (v1.3) tool_call. */
  text?: string;
  data?: Uint8Array;
  tool_call?: ToolCall;
}
/** The answer to a ToolCall (v1.3): its output (text; JSON by convention), or with `is_error` how it failed. */
export interface ToolResult { id: string; content: string; is_error?: boolean }
/** More input for a running stream (v1.3), numbered per stream from 1; at most one item; `end`: the last. */
export interface Input extends Message {
  type: "input";
  stream_id: number;
  seq: number;
  text?: string;
  data?: Uint8Array;
  tool_result?: ToolResult;
  end?: boolean;
}
export interface End extends Message {
  type: "end";
  stream_id: number;
  last_seq: number;
  finish_reason: "stop" | "cancelled" | "warmup" | string;
  timings_ms: Record<string, number>;
  usage: Record<string, number>;
}
export interface ServerError extends Message {
  type: "error";
  stream_id: number;
  code: ErrorCodeName;
  message: string;
  retryable: boolean;
}
export interface GoAway extends Message { type: "goaway"; reason: string; reconnect_after_ms: number }
/** The answer to a Subscribe (v1.1): `code` "unspecified" when done, else why it was refused. */
export interface Subscribed extends Message {
  type: "subscribed";
  id: number;
  group: string;
  leave: boolean;
  code: ErrorCodeName;
  message: string;
}
interface PushMessage extends Message {
  type: "push";
  /** Where it was published: "session:<id>", "user:<name>" or "group:<name>". */
  topic: string;
}
/** A message the server published (v1.1): exactly one of `text` and `data` (`push.text !== undefined` tells which). */
export type Push =
  | (PushMessage & { text: string; data?: undefined })
  | (PushMessage & { data: Uint8Array; text?: undefined });

/** Encodes and decodes frames; the built-in ones are `jsonCodec` and `protoCodec`. */
export interface Codec {
  subprotocol: string;
  binary: boolean;
  encode(msg: Message): string | Uint8Array;
  decode(frame: string | ArrayBuffer | Uint8Array): Message;
}
export declare const jsonCodec: Readonly<Codec>;
export declare const protoCodec: Readonly<Codec>;

/** A chunk of a stream: text, bytes, or (v1.3) a tool call the model waits for (`chunk instanceof ToolCall`). */
export type Chunk = string | Uint8Array | ToolCall;
export type StreamStatus = "pending" | "streaming" | "done" | "failed";

/** A tool the stream runs itself (v1.3): called with the call's parsed arguments; its result (or the Promise's) is
 * sent as the answer, a string as it is, anything else as JSON; a thrown error is sent with `is_error`. */
export type Tool = (args: any, call: ToolCall) => unknown;

export interface StreamOptions {
  model?: string;
  params?: Record<string, unknown>;
  /** (v1.3) Tool name -> function: the model's calls of these tools are answered by the stream, not yielded. */
  tools?: Record<string, Tool>;
  /** Cancels the stream when aborted. */
  signal?: AbortSignal;
  /** Given: chunks go to the callbacks instead of the iterator. */
  onDelta?: (chunk: Chunk, delta: Delta) => void;
  onEnd?: (end: End) => void;
  onError?: (error: Error) => void;
  /** v1.3: the context documents (or their names) the model gets. */
  context?: (ContextDocument | string)[];
  /** v1.3: an earlier stream (or its id) of this session whose turns the model gets; needs `history: true`. */
  continues?: Stream | number;
}

/** A context document of the client's session (v1.3), made by `client.context(name, text)`. */
export declare class ContextDocument {
  readonly name: string;
  /** The current text. */
  readonly text: string;
  /** The current version (each change makes the next). */
  readonly version: number;
  /** The highest version the server acknowledged. */
  readonly acked: number;
  /** Whole texts sent (the first one, and each recovery). */
  readonly fullSends: number;
  /** The last refusal of the current text, if any. */
  readonly refusal: ContextAck | null;
  /** A refusal that sending the text again cannot cure (context_limit, bad_request): `whenSynced()` rejects with it
   * until the next `set()`. */
  readonly failed: ContextAck | null;
  /** Whether the server acknowledged the current version. */
  readonly synced: boolean;
  /** Replace the whole text (RangeError for a lone surrogate). */
  set(text: string): void;
  /** Replace `length` UTF-16 code units at `offset` with `text` (RangeError outside the text, inside a surrogate
   * pair, or for a lone surrogate in `text`). */
  patch(offset: number, length: number, text: string): void;
  /** Replace the first occurrence of `old` (RangeError if it does not occur). */
  replace(old: string, replacement: string): void;
  /** Forget the document, here and on the server. */
  drop(): void;
  /** Resolves once the server acknowledged the current version; rejects after `timeout` ms, or with a StreamError
   * when it refused it for good (`failed`). */
  whenSynced(timeout?: number): Promise<void>;
}
/** A prompt: its text, binary input, or a request object. */
export type StreamInput =
  | string
  | Uint8Array
  | ({ text?: string; messages?: ChatMessage[]; data?: Uint8Array } & StreamOptions);

/** One streamed reply: an async iterator of chunks, or callbacks; `done` resolves with the End. */
export declare class Stream implements AsyncIterableIterator<Chunk> {
  readonly client: LowLatClient;
  readonly id: number;
  status: StreamStatus;
  end: End | null;
  error: Error | null;
  receivedSeq: number;
  deliveredSeq: number;
  /** performance.now() when the Request was sent, when the first Delta came, when it finished. */
  startedAt: number | null;
  firstDeltaAt: number | null;
  finishedAt: number | null;
  deltas: number;
  rawBytes: number;
  wireBytes: number;
  resends: number;
  /** The End, or rejects with the error that ended the stream. */
  readonly done: Promise<End>;
  /** Milliseconds from sending the Request to the first Delta (null before it). */
  readonly timeToFirstDelta: number | null;
  readonly deltasPerSecond: number | null;
  readonly finished: boolean;
  /** Ask the server to stop it (it ends with finish_reason "cancelled"). */
  cancel(): void;
  next(): Promise<IteratorResult<Chunk, undefined>>;
  return(): Promise<IteratorResult<Chunk, undefined>>;
  [Symbol.asyncIterator](): AsyncIterableIterator<Chunk>;
  /** The whole reply as a string; rejects with a LowLatError at a tool call the `tools` option does not answer. */
  text(): Promise<string>;
  /** (v1.3) The tools the stream answers itself (the `tools` option). */
  tools: Record<string, Tool> | null;
  /** (v1.3) Send the running model more input (text or bytes); `end`: the last of it. Kept until the stream ends and
   * sent again after a resume if the server lacks it. Rejects with a LowLatError if the server is older than v1.3 or
   * the stream has ended. */
  send(item: string | Uint8Array | ArrayBuffer | ArrayBufferView, options?: { end?: boolean }): Promise<void>;
  /** (v1.3) Answer tool call `call` (or its id) with `content`: a string, else sent as JSON; `isError`: the tool
   * failed and `content` says how. */
  sendResult(call: ToolCall | string, content: unknown, options?: { isError?: boolean; end?: boolean }): Promise<void>;
  /** (v1.3) No more input for this stream. */
  endInput(): Promise<void>;
}

/** The server's pushes as they arrive (`client.pushes()`); ends when left, aborted or the client is closed. */
export declare class PushIterator implements AsyncIterableIterator<Push> {
  readonly client: LowLatClient;
  /** Pushes held unread at most (the client's `maxPushes`). */
  readonly max: number;
  /** Pushes dropped because `max` were waiting unread. */
  dropped: number;
  readonly finished: boolean;
  next(): Promise<IteratorResult<Push, undefined>>;
  /** Stop listening. */
  return(): Promise<IteratorResult<Push, undefined>>;
  [Symbol.asyncIterator](): AsyncIterableIterator<Push>;
}

export type ConnectionState = "idle" | "connecting" | "connected" | "reconnecting" | "closed";

export interface ClientOptions {
  /** WebSocket path on the page's host when no URL is given. Default "/ws". */
  path?: string;
  mode?: "json" | "proto";
  codec?: Codec;
  backoff?: Backoff | BackoffOptions;
  resume?: boolean;
  /** Bytes the server may run ahead of consumption (Acks); 0 turns Acks off. Default 1 MiB. */
  flowWindow?: number;
  /** Milliseconds. */
  openTimeout?: number;
  heartbeatTimeout?: number;
  heartbeatInterval?: number | null;
  keepAlive?: boolean;
  /** Pushes a `pushes()` iterator holds unread before it drops the oldest. Default 1000. */
  maxPushes?: number;
  /** Hello.auth, for the server's authenticate hook. */
  auth?: string;
  /** A warm-up request (v1.2) sent in the background whenever a connection starts a new session. */
  warmup?: StreamInput | null;
  /** v1.3: ask the server to keep this session's turns, so that a request can continue one (`continues`). */
  history?: boolean;
  clientName?: string;
  /** The WebSocket class (e.g. the `ws` package's in Node before 22, which also tells why a connection failed).
   * Default globalThis.WebSocket (at connect time); with neither, connecting fails at once with a NoWebSocketError. */
  WebSocket?: unknown;
}

export interface ClientEvents {
  statechange: { state: ConnectionState; previous: ConnectionState; resumed: boolean; [extra: string]: unknown };
  welcome: Welcome;
  send: { msg: Message; bytes: number };
  message: { msg: Message; bytes: number };
  servererror: ServerError;
  goaway: GoAway;
  /** A push to this client's session, user or one of its groups (v1.1). */
  push: Push;
  /** The `warmup` option's background warm-up failed (the hook's error); requests work without it. */
  warmupfailed: Error;
}

/** One WebSocket to a lowlat-mw server, many streams on it; reconnects with backoff and resumes. */
export declare class LowLatClient extends EventTarget {
  constructor(url?: string | URL, options?: ClientOptions);
  constructor(options: ClientOptions);
  readonly url: string;
  readonly mode: "json" | "proto";
  readonly codec: Codec;
  readonly backoff: Backoff;
  state: ConnectionState;
  resumed: boolean;
  welcome: Welcome | null;
  goaway: GoAway | null;
  lastClose: { code: number; reason: string } | null;
  lastError: ServerError | null;
  finalError: Error | null;
  connections: number;
  resumes: number;
  /** Milliseconds, from the last Pong. */
  rtt: number | null;
  stats: { framesIn: number; framesOut: number; bytesIn: number; bytesOut: number; wireIn: number; wireOut: number };
  readonly streams: Map<number, Stream>;
  /** The push groups joined (joined again when the client reconnects to a new session). */
  readonly groups: ReadonlySet<string>;
  maxPushes: number;
  /** The `warmup` option's request, if any. */
  warmupRequest: StreamInput | null;
  /** Warm-up requests the server ran. */
  warmups: number;
  /** Whether the server keeps this session's turns (the `history` option). */
  readonly history: boolean;
  /** The context documents (v1.3), by name. */
  readonly documents: ReadonlyMap<string, ContextDocument>;
  /** The session's context document `name` with `text` as its whole text (v1.3); rejects against an older server. */
  context(name: string, text?: string): Promise<ContextDocument>;
  readonly connected: boolean;
  /** Connect now (with the backoff's retries); resolves with the Welcome. */
  connect(): Promise<Welcome>;
  stream(input: StreamInput, options?: StreamOptions): Stream;
  complete(input: StreamInput, options?: StreamOptions): Promise<string>;
  /** Run the model's warm-up hook for this input (v1.2) and resolve with its End (finish_reason "warmup");
   * null, with nothing sent, against an older server. */
  warmup(input?: StreamInput, options?: StreamOptions): Promise<End | null>;
  /** Round trip of a protocol Ping, in milliseconds. */
  ping(timeout?: number): Promise<number>;
  close(code?: number, reason?: string): void;
  /** Join push group `group` (v1.1); rejects with a StreamError if the server refuses. `timeout` in ms. */
  subscribe(group: string, timeout?: number): Promise<void>;
  /** Leave push group `group`. */
  unsubscribe(group: string, timeout?: number): Promise<void>;
  /** The pushes from now on; `signal` ends the iterator when aborted. */
  pushes(options?: { signal?: AbortSignal }): PushIterator;
  /** Subscribe to an event; returns the unsubscribe function. */
  on<K extends keyof ClientEvents>(type: K, fn: (detail: ClientEvents[K]) => void): () => void;
}

/** A LowLatClient, connected. */
export declare function connect(url?: string | URL, options?: ClientOptions): Promise<LowLatClient>;
export declare function connect(options: ClientOptions): Promise<LowLatClient>;
