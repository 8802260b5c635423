// An ACP agent built with the official TypeScript SDK, knowing nothing of crew: crew drives
// it as its client (`protocol = "acp"`).
//
//   node agent.mjs
//
// Each prompt turn: says what it was asked (as message chunks), announces a tool call, asks
// permission to write `ts-agent.txt` (allow once, reject once), writes it through the client's
// `fs/write_text_file` when allowed, reads it back with `fs/read_text_file`, reports the
// session's cost (`usage_update`) and ends `end_turn`.

import { Readable, Writable } from "node:stream";
import { agent, methods, ndJsonStream } from "@agentclientprotocol/sdk";

const sessions = new Map();
let cost = 0;

const app = agent({ name: "ts-agent" })
  .onRequest(methods.agent.initialize, () => ({
    protocolVersion: 1,
    agentCapabilities: { loadSession: false },
    agentInfo: { name: "ts-agent", version: "1.0.0" },
  }))
  .onRequest(methods.agent.session.new, (context) => {
    const sessionId = `ts-${process.pid}-${sessions.size}`;
    sessions.set(sessionId, { cwd: context.params.cwd });
    return { sessionId };
  })
  .onNotification(methods.agent.session.cancel, () => {})
  .onRequest(methods.agent.session.prompt, async (context) => {
    const { sessionId, prompt } = context.params;
    const session = sessions.get(sessionId);
    const asked = prompt.filter((block) => block.type === "text").map((block) => block.text).join("");
    const update = (update) =>
      context.client.notify(methods.client.session.update, { sessionId, update });
    const say = async (text) => {
      // Streamed in two chunks, cut mid-word.
      await update({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: text.slice(0, 4) } });
      await update({ sessionUpdate: "agent_message_chunk", content: { type: "text", text: `${text.slice(4)}\n` } });
    };
    await say(`TypeScript agent asked: ${asked}`);
    const path = `${session.cwd}/ts-agent.txt`;
    await update({
      sessionUpdate: "tool_call",
      toolCallId: "write-1",
      title: "Write ts-agent.txt",
      kind: "edit",
      status: "pending",
      locations: [{ path }],
    });
    const permission = await context.client.request(methods.client.session.requestPermission, {
      sessionId,
      toolCall: { toolCallId: "write-1", title: "Write ts-agent.txt" },
      options: [
        { optionId: "allow", name: "Allow once", kind: "allow_once" },
        { optionId: "reject", name: "Reject", kind: "reject_once" },
      ],
    });
    const allowed =
      permission.outcome.outcome === "selected" && permission.outcome.optionId === "allow";
    if (allowed) {
      await context.client.request(methods.client.fs.writeTextFile, {
        sessionId,
        path,
        content: `${asked}\n`,
      });
      const read = await context.client.request(methods.client.fs.readTextFile, { sessionId, path });
      await say(`wrote and read back: ${read.content.trim()}`);
      await update({ sessionUpdate: "tool_call_update", toolCallId: "write-1", status: "completed" });
    } else {
      await say("not allowed to write");
      await update({ sessionUpdate: "tool_call_update", toolCallId: "write-1", status: "failed" });
    }
    cost += 0.5;
    await update({ sessionUpdate: "usage_update", used: 1200, size: 200000, cost: { amount: cost, currency: "USD" } });
    return { stopReason: "end_turn" };
  });

const stream = ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin));
const connection = app.connect(stream);
await connection.closed;
