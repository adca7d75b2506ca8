// A minimal page using the useAISocket hook (React without JSX or a build step).
import React from "react";
import { useAISocket } from "./useAISocket.js";

const h = React.createElement;
const query = new URLSearchParams(location.search);
const params = {};
for (const name of ["delay", "tokens"]) if (query.get(name)) params[name] = Number(query.get(name));
const clientOptions = query.get("backoff") ? { backoff: { base: Number(query.get("backoff")) } } : {};

function Chat() {
  const { state, resumed, text, streaming, error, end, send, stop, client } = useAISocket(undefined, {
    params, client: clientOptions,
  });
  const [prompt, setPrompt] = React.useState("Hello from React");
  React.useEffect(() => { window.chatClient = client; }, [client]); // for the curious (and the tests)
  const label = state === "connected" && resumed ? "resumed" : state;
  return h("section", null,
    h("p", null, "Connection: ", h("span", { id: "state", className: "state" }, label)),
    h("form", { onSubmit: (e) => { e.preventDefault(); send(prompt); } },
      h("input", { id: "prompt", value: prompt, onChange: (e) => setPrompt(e.target.value), size: 40 }),
      " ", h("button", { id: "send", type: "submit" }, "Send"),
      " ", h("button", { id: "stop", type: "button", onClick: stop, disabled: !streaming }, "Stop")),
    h("p", { id: "text" }, text),
    h("p", { id: "result" }, error ? `${error.name}: ${error.message}` : end ? `finished: ${end.finish_reason}` : ""));
}

function App() {
  const [shown, setShown] = React.useState(true);
  return h("main", null,
    h("h1", null, "useAISocket"),
    h("button", { id: "toggle", onClick: () => setShown((s) => !s) }, shown ? "Unmount the chat" : "Mount the chat"),
    shown ? h(Chat) : h("p", { id: "unmounted" }, "Unmounted: the hook closed its WebSocket."));
}

ReactDOM.createRoot(document.getElementById("root")).render(h(React.StrictMode, null, h(App)));
