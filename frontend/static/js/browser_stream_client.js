// The browser stream's client: the run page's Server-Sent Events from GET /api/runs/<id>/stream/
// (posttrain.telemetry.browser_stream; docs/ARCHITECTURE.md, "The event path").
// Plain ES module, no build step.
//
//   const stream = openRunStream(runId, {lastEventId, onMetrics, onSamples, onLog, onCheckpoint,
//                                        onState, onEnd, onConnection});
//   stream.lastSeq();  stream.close();
//
// `lastEventId` is the seq the page's initial REST reads covered: the stream starts after it. When the
// connection drops, EventSource reconnects by itself and sends Last-Event-ID, which the server prefers
// to the URL's last_event_id, so it resumes where the page stands. Handlers get the message's JSON:
//   onMetrics({seq, step, time, values})   onSamples({seq, step, count})   onCheckpoint({seq, step, path})
//   onLog({seq, step, time, level, message})   onState({state, reason, last_step})   onEnd()
//   onConnection("live" | "reconnecting" | "closed")

const SEQ_KINDS = { metrics: "onMetrics", samples: "onSamples", log: "onLog", checkpoint: "onCheckpoint" };

export function openRunStream(runId, {
  lastEventId = 0, onMetrics, onSamples, onLog, onCheckpoint, onState, onEnd, onConnection,
} = {}) {
  const handlers = { onMetrics, onSamples, onLog, onCheckpoint };
  let lastSeq = Number(lastEventId) || 0;
  let closed = false;
  const url = `/api/runs/${encodeURIComponent(runId)}/stream/?last_event_id=${lastSeq}`;
  const source = new EventSource(url, { withCredentials: true });

  const connection = (status) => { if (onConnection) onConnection(status); };
  const parse = (event) => {
    try { return JSON.parse(event.data); } catch (error) {
      console.error("run stream: a message that is not JSON", event.type, error);
      return null;
    }
  };

  for (const [kind, handlerName] of Object.entries(SEQ_KINDS)) {
    source.addEventListener(kind, (event) => {
      const data = parse(event);
      // The server never repeats a seq; this guards the page's curves should that ever break.
      if (!data || typeof data.seq !== "number" || data.seq <= lastSeq) return;
      lastSeq = data.seq;
      const handler = handlers[handlerName];
      if (handler) handler(data);
    });
  }
  source.addEventListener("state", (event) => {
    const data = parse(event);
    if (data && onState) onState(data);
  });
  source.addEventListener("end", () => {
    close();
    if (onEnd) onEnd();
  });
  source.addEventListener("open", () => connection("live"));
  source.addEventListener("error", () => {
    if (closed) return;
    // CONNECTING: EventSource retries by itself (the server ends streams every few minutes on purpose).
    // CLOSED: it gave up (the server refused: signed out, no access, run gone).
    if (source.readyState === EventSource.CLOSED) {
      closed = true;
      connection("closed");
    } else {
      connection("reconnecting");
    }
  });

  function close() {
    if (closed) return;
    closed = true;
    source.close();
    connection("closed");
  }

  return { close, lastSeq: () => lastSeq };
}
