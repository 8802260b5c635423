// Drives `crew mcp` with the official MCP TypeScript SDK, as a lead agent's client would.
//
//   node drive.mjs flows <crew> <project A> <project B>
//       every tool, a question answered, a stop, malformed arguments, another folder;
//       prints one JSON line with what it saw
//   node drive.mjs orphan <crew> <project A>
//       starts a run, prints its id, and waits to be killed
//   node drive.mjs closes <crew> <project A>
//       starts a run, closes the connection as the SDK does, and prints the run's id
//
// Exits non-zero (with the reason on stderr) when crew does not behave as it must.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [mode, crew, projectA, projectB] = process.argv.slice(2);

function fail(message) {
  process.stderr.write(`drive.mjs: ${message}\n`);
  process.exit(1);
}
function check(condition, message) {
  if (!condition) fail(message);
}
setTimeout(() => fail("timed out after 90 s"), 90_000).unref();

async function connect(cwd) {
  // The whole environment: inside a crew agent, crew's own variables say whose run it is.
  const transport = new StdioClientTransport({ command: crew, args: ["mcp"], cwd, env: process.env, stderr: "inherit" });
  const client = new Client({ name: "crew-mcp-test", version: "1.0.0" });
  await client.connect(transport);
  return client;
}
async function call(client, name, args) {
  const result = await client.callTool({ name, arguments: args });
  check(!result.isError, `${name} failed: ${JSON.stringify(result)}`);
  check(result.structuredContent, `${name} gave no structured result: ${JSON.stringify(result)}`);
  return result.structuredContent;
}
async function refused(client, name, args) {
  try {
    const result = await client.callTool({ name, arguments: args });
    return result.isError ? JSON.stringify(result.content) : null;
  } catch (error) {
    return String(error.message ?? error);
  }
}
// How a call was refused: a result with isError whose _meta says which kind crew made of it
// (`arguments`, `refused`; a bare `result` when the SDK refused the arguments' shape itself),
// or a protocol error's code.
async function refusedAs(client, name, args) {
  try {
    const result = await client.callTool({ name, arguments: args });
    if (!result.isError) return "done";
    return result._meta?.["crew/kind"] ?? "result";
  } catch (error) {
    return `protocol error ${error.code}: ${error.message}`;
  }
}
const task = (run, id) => run.tasks.find((t) => t.id === id);

if (mode === "nested") {
  // Run as a crew agent: the tasks join this agent's own run.
  const client = await connect(projectA);
  const joined = await call(client, "run_tasks", {
    tasks: [
      { id: "sub1", prompt: "echo one > one.txt", agent: "shell" },
      { id: "sub2", prompt: "echo two > two.txt", agent: "shell", depends_on: ["sub1"] },
    ],
    wait: true,
  });
  check(joined.run_id === process.env.CREW_RUN_ID, `joined ${joined.run_id}, not ${process.env.CREW_RUN_ID}`);
  check(["sub1", "sub2"].every((id) => task(joined, id)?.status === "succeeded"), `sub-tasks: ${JSON.stringify(joined)}`);
  await client.close();
  process.stdout.write(JSON.stringify({ ok: true, run: joined.run_id }) + "\n");
  process.exit(0);
}

if (mode === "closes") {
  // The lead agent's session ends as the SDK ends it: close() closes the server's input, then
  // TERMs it two seconds later, then KILLs it; the run's one task is still at work meanwhile.
  const client = await connect(projectA);
  const started = await call(client, "run_tasks", {
    tasks: [{ id: "late", prompt: "sleep 6 && echo late > late.txt", agent: "shell" }],
  });
  await client.close();
  process.stdout.write(started.run_id + "\n");
  process.exit(0);
}

if (mode === "orphan") {
  const client = await connect(projectA);
  const started = await call(client, "run_tasks", {
    tasks: [{ id: "orphan", prompt: "echo kept > kept.txt && sleep 2", agent: "shell" }],
  });
  process.stdout.write(started.run_id + "\n");
  await new Promise(() => {});
}

const a = await connect(projectA);
const tools = (await a.listTools()).tools;
const names = tools.map((t) => t.name).sort();
check(
  JSON.stringify(names) === JSON.stringify(["answer", "diff", "land", "run_tasks", "status", "steer", "stop", "wait"]),
  `tools: ${names}`,
);
const runTasks = tools.find((t) => t.name === "run_tasks");
check(runTasks.inputSchema.properties.tasks.type === "array", `run_tasks schema: ${JSON.stringify(runTasks.inputSchema)}`);
// Optional counts are plain integers, as clients that fill arguments by type can give them.
check(runTasks.inputSchema.properties.attempts.type === "integer", `attempts: ${JSON.stringify(runTasks.inputSchema)}`);
const waitTool = tools.find((t) => t.name === "wait");
check(waitTool.inputSchema.properties.timeout_s.type === "integer", `timeout_s: ${JSON.stringify(waitTool.inputSchema)}`);
check(tools.every((t) => t.description && t.outputSchema), "every tool has a description and an output schema");

// Three tasks, one after another's success; wait, status, diff.
const started = await call(a, "run_tasks", {
  tasks: [
    // A moment of work each, so that `wait` starts before they end and reports progress.
    { id: "a", prompt: "sleep 0.3 && echo alpha > a.txt", agent: "shell" },
    { id: "b", prompt: "sleep 0.3 && echo beta > b.txt", agent: "shell" },
    { id: "c", prompt: "echo gamma > c.txt", agent: "shell", depends_on: ["a"] },
  ],
});
check(typeof started.run_id === "string", `run_tasks: ${JSON.stringify(started)}`);
const progress = [];
const waited = await a.callTool(
  { name: "wait", arguments: { run: started.run_id, timeout_s: 60 } },
  undefined,
  { onprogress: (note) => progress.push(note) },
);
const done = waited.structuredContent;
// Notifications say how many of the 3 tasks have finished, never fewer than before. (The last
// one may reach the client after the result, when the client has stopped listening.)
check(
  progress.length >= 1 &&
    progress.every((note, i) => note.total === 3 && (i === 0 || note.progress >= progress[i - 1].progress)),
  `progress while waiting: ${JSON.stringify(progress)}`,
);
check(done.status === "completed", `wait: ${JSON.stringify(done)}`);
check(["a", "b", "c"].every((id) => task(done, id).status === "succeeded" && task(done, id).branch), `tasks: ${JSON.stringify(done)}`);
const status = await call(a, "status", { run: started.run_id });
check(status.runs.length === 1 && status.runs[0].run_id === started.run_id, `status: ${JSON.stringify(status)}`);
const diff = await call(a, "diff", { run: started.run_id, task: "c" });
check(diff.patch.includes("+gamma") && !diff.truncated, `diff: ${JSON.stringify(diff)}`);

// Land them on the branch the run started from, c after a (it depends on a).
const unknownTask = await refused(a, "land", { run: started.run_id, tasks: ["nope"] });
check(unknownTask && unknownTask.includes("tasks"), `land of an unknown task: ${unknownTask}`);
const landed = await call(a, "land", { run: started.run_id, mode: "squash" });
check(
  landed.landed && landed.into === "main" && landed.tasks.indexOf("c") > landed.tasks.indexOf("a") && landed.from !== landed.to,
  `land: ${JSON.stringify(landed)}`,
);

// An agent that reports its usage: tokens and cost in status.
const costly = await call(a, "run_tasks", {
  tasks: [{ id: "priced", prompt: "write priced.txt", agent: "claude" }],
  wait: true,
});
const priced = task((await call(a, "status", { run: costly.run_id })).runs[0], "priced");
check(
  priced.status === "succeeded" && priced.cost_usd === 0.0125 && priced.tokens_in === 155 && priced.tokens_out === 20,
  `usage in status: ${JSON.stringify(priced)}`,
);

// Best of two, each with a check: the lead agent sees which attempts pass.
const best = await call(a, "run_tasks", {
  tasks: [{ id: "best", agent: "shell", prompt: "echo $CREW_TASK_ID > attempt.txt" }],
  attempts: 2,
  check: "grep -q best.2 attempt.txt",
  wait: true,
});
check(
  JSON.stringify(best.tasks.map((t) => [t.id, t.status, t.check_passed])) ===
    JSON.stringify([["best.1", "succeeded", false], ["best.2", "succeeded", true]]),
  `best of two: ${JSON.stringify(best)}`,
);
const emptyCheck = await refused(a, "run_tasks", { tasks: [{ id: "z", prompt: "true", agent: "shell" }], check: " " });
check(emptyCheck && emptyCheck.includes("check"), `an empty check: ${emptyCheck}`);
const badLimit = await refused(a, "run_tasks", { tasks: [{ id: "z", prompt: "true", agent: "shell" }], on_limit: "wait" });
check(badLimit && badLimit.includes("`fail` or `pause`"), `on_limit: ${badLimit}`);

// A task asks; the answer reaches it.
const asking = await call(a, "run_tasks", {
  tasks: [{
    id: "asker",
    agent: "shell",
    prompt: "if [ -z \"$CREW_MESSAGE\" ]; then crew ask 'which color?'; exit 0; fi; echo \"$CREW_MESSAGE\" > color.txt",
  }],
  wait: true,
});
check(task(asking, "asker").question === "which color?", `question: ${JSON.stringify(asking)}`);
await call(a, "answer", { run: asking.run_id, task: "asker", message: "blue" });
const answered = await call(a, "wait", { run: asking.run_id, timeout_s: 60 });
check(answered.status === "completed", `after the answer: ${JSON.stringify(answered)}`);
check((await call(a, "diff", { run: asking.run_id, task: "asker" })).patch.includes("+blue"), "the answer is in the work");

// Stop one task: its work is kept.
const long = await call(a, "run_tasks", {
  tasks: [{ id: "long", agent: "shell", prompt: "echo partial > partial.txt && echo started && sleep 600" }],
});
for (let i = 0; i < 600; i++) {
  const now = await call(a, "status", { run: long.run_id });
  if (task(now.runs[0], "long").status === "running") break;
  await new Promise((r) => setTimeout(r, 50));
}
const stopped = await call(a, "stop", { run: long.run_id, task: "long" });
check(stopped.agent_id.endsWith(":long"), `stop: ${JSON.stringify(stopped)}`);
const afterStop = await call(a, "wait", { run: long.run_id, timeout_s: 60 });
check(task(afterStop, "long").status === "stopped" && task(afterStop, "long").branch, `stopped: ${JSON.stringify(afterStop)}`);

// Malformed arguments: an error naming the field, and nothing starts.
const before = (await call(a, "status", {})).runs.length;
const missing = await refused(a, "run_tasks", { tasks: [{ id: "x", agent: "shell" }] });
check(missing && missing.includes("prompt"), `missing prompt: ${missing}`);
const badId = await refused(a, "run_tasks", { tasks: [{ id: "a/b", prompt: "true", agent: "shell" }] });
check(badId && badId.includes("tasks"), `bad id: ${badId}`);
const unknownField = await refused(a, "run_tasks", { tasks: [{ id: "y", prompt: "true", agent: "shell", workspace_mode: "single" }] });
check(unknownField && unknownField.includes("workspace_mode"), `a lead agent choosing a mode: ${unknownField}`);
// Each refusal is the error it is: what the caller can correct is the tool's result, which the
// lead agent's model reads, saying whether the arguments or the request was at fault.
for (const [what, name, args, expected] of [
  ["a bad task id", "run_tasks", { tasks: [{ id: "a/b", prompt: "true", agent: "shell" }] }, "arguments"],
  ["a missing prompt", "run_tasks", { tasks: [{ id: "x", agent: "shell" }] }, "result"],
  ["an empty check", "run_tasks", { tasks: [{ id: "z", prompt: "true", agent: "shell" }], check: " " }, "arguments"],
  ["an unknown run", "wait", { run: "zzzzzzzz", timeout_s: 1 }, "refused"],
  ["an unknown task", "land", { run: started.run_id, tasks: ["nope"] }, "refused"],
  ["a task that is not live", "steer", { run: started.run_id, task: "a", message: "hi" }, "refused"],
]) {
  const got = await refusedAs(a, name, args);
  check(got === expected, `${what}: ${got}, not ${expected}`);
}
check((await call(a, "status", {})).runs.length === before, "nothing started");

// Another folder's server sees none of it, and cannot act on it.
const b = await connect(projectB);
const elsewhere = await call(b, "status", {});
check(elsewhere.runs.length === 0, `B sees A's runs: ${JSON.stringify(elsewhere)}`);
const foreign = await refused(b, "stop", { run: long.run_id, task: "long" });
check(foreign !== null, "B refused A's run");
const foreignAs = await refusedAs(b, "stop", { run: long.run_id, task: "long" });
check(foreignAs === "refused", `B's refusal: ${foreignAs}`);

await a.close();
await b.close();
process.stdout.write(JSON.stringify({ ok: true, runs: [started.run_id, asking.run_id, long.run_id] }) + "\n");
