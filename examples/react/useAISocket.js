// useAISocket: a React hook over the lowlat-mw browser client (lowlat_mw/static/lowlat.js).
//
//   const { state, resumed, text, streaming, error, send, stop } = useAISocket("ws://127.0.0.1:8000/ws");
//   <button onClick={() => send("hello")}>Ask</button> <button onClick={stop}>Stop</button> <p>{text}</p>
//
// One persistent WebSocket per mounted component (per url and mode): it is opened on mount and
// closed on unmount. The client reconnects with exponential backoff and full jitter after a drop
// and resumes the running reply where it stopped (no token lost or repeated), so `text` simply
// keeps growing; `state` goes "connected" -> "reconnecting" -> "connected" with `resumed` true.
//
// Plain ES module, no build step needed: "react" is whatever your bundler or import map gives,
// and "lowlat-mw" must resolve to lowlat.js (served by the adapters under `client_path`, e.g.
// /lowlat/lowlat.js, or a copy of lowlat_mw/static/lowlat.js in your app). See docs/browser.md.
import { useCallback, useEffect, useRef, useState } from "react";
import { LowLatClient } from "lowlat-mw";

const decoder = new TextDecoder();

/**
 * @param {string} [url] WebSocket URL (default: ws(s)://<page host>/ws)
 * @param {object} [options] {mode: "json"|"proto", params, model, client: {...LowLatClient options}}
 */
export function useAISocket(url, options = {}) {
  const mode = options.mode || "json";
  const [state, setState] = useState("idle");
  const [resumed, setResumed] = useState(false);
  const [text, setText] = useState("");
  const [streaming, setStreaming] = useState(false);
  const [error, setError] = useState(null);
  const [end, setEnd] = useState(null);
  const clientRef = useRef(null);
  const streamRef = useRef(null);
  const optionsRef = useRef(options);
  optionsRef.current = options;

  useEffect(() => {
    const client = new LowLatClient(url, { keepAlive: true, ...optionsRef.current.client, mode });
    clientRef.current = client;
    const off = client.on("statechange", (detail) => {
      setState(detail.state);
      setResumed(Boolean(detail.resumed));
    });
    client.connect().catch((err) => {
      if (clientRef.current === client) setError(err);
    });
    return () => {
      // Unmount (or a new url/mode): forget the stream first so its callbacks set no state, then
      // cancel it on the server and close the socket for good.
      off();
      const stream = streamRef.current;
      streamRef.current = null;
      clientRef.current = null;
      if (stream && !stream.finished) stream.cancel();
      client.close();
    };
  }, [url, mode]);

  /** Start a reply to `prompt` (cancelling the running one); returns the client's Stream. */
  const send = useCallback((prompt, requestOptions = {}) => {
    const client = clientRef.current;
    if (!client) return null;
    const previous = streamRef.current;
    if (previous && !previous.finished) previous.cancel();
    const { params, model } = optionsRef.current;
    setText("");
    setError(null);
    setEnd(null);
    setStreaming(true);
    const stream = client.stream(prompt, {
      params, model, ...requestOptions,
      onDelta(chunk) {
        if (streamRef.current !== stream) return;
        const piece = typeof chunk === "string" ? chunk : decoder.decode(chunk);
        setText((t) => t + piece);
      },
      onEnd(result) {
        if (streamRef.current !== stream) return;
        setEnd(result);
        setStreaming(false);
      },
      onError(err) {
        if (streamRef.current !== stream) return;
        setError(err);
        setStreaming(false);
      },
    });
    streamRef.current = stream;
    return stream;
  }, []);

  /** Cancel the running reply: it ends with End(finish_reason "cancelled"). */
  const stop = useCallback(() => {
    const stream = streamRef.current;
    if (stream && !stream.finished) stream.cancel();
  }, []);

  return { state, resumed, text, streaming, error, end, send, stop, client: clientRef.current };
}

export default useAISocket;
