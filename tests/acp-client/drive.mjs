// Drives `crew serve --stdio` with the official ACP TypeScript SDK, as an editor would.
//
//   node drive.mjs <crew binary> <project A> <project B>
//
// Project A has teams `pair`, `ask` and `slow`; project B has `[run] default_agent = "shell"`. Prints one JSON
// line with what it saw, and exits non-zero (with the reason on stderr) when the agent did
// not behave as an ACP agent must.

import { execFileSync, spawn } from "node:child_process";
import { Readable, Writable } from "node:stream";
import { client, methods, ndJsonStream } from "@agentclientprotocol/sdk";

const [crew, projectA, projectB] = process.argv.slice(2);

function fail(message) {
  process.stderr.write(`drive.mjs: ${message}\n`);
  process.exit(1);
}

function check(condition, message) {
  if (!condition) fail(message);
}

// A flow that never ends is a failure, not a hang.
const deadline = setTimeout(() => {
  child.kill("SIGKILL");
  fail("timed out after 60 s");
}, 60_000);

const child = spawn(crew, ["serve", "--stdio"], {
  cwd: projectA,
  stdio: ["pipe", "pipe", "inherit"],
});
child.on("error", (error) => fail(`cannot start crew: ${error}`));
const stream = ndJsonStream(Writable.toWeb(child.stdin), Readable.toWeb(child.stdout));

// Every session/update, by session.
const updates = new Map();
const waiters = [];
function record(params) {
  const list = updates.get(params.sessionId) ?? [];
  list.push(params.update);
  updates.set(params.sessionId, list);
  for (const waiter of [...waiters]) {
    if (waiter.sessionId === params.sessionId && waiter.test(params.update)) {
      waiters.splice(waiters.indexOf(waiter), 1);
      waiter.resolve();
    }
  }
}
function waitFor(sessionId, test) {
  if ((updates.get(sessionId) ?? []).some(test)) return Promise.resolve();
  return new Promise((resolve) => waiters.push({ sessionId, test, resolve }));
}
const text = (update) =>
  update.sessionUpdate === "agent_message_chunk" && update.content.type === "text"
    ? update.content.text
    : "";
const transcript = (sessionId) => (updates.get(sessionId) ?? []).map(text).join("");

// An agent's question reaches the person as a permission request; they pick "yes".
const questions = [];
const app = client({ name: "crew-acp-test" })
  .onNotification(methods.client.session.update, (context) => record(context.params))
  .onRequest(methods.client.session.requestPermission, (context) => {
    questions.push({
      sessionId: context.params.sessionId,
      title: context.params.toolCall.title,
      options: context.params.options.map((option) => option.optionId),
    });
    return { outcome: { outcome: "selected", optionId: "yes" } };
  });

const seen = await app.connectWith(stream, async (ctx) => {
  const init = await ctx.request(methods.agent.initialize, {
    protocolVersion: 1,
    clientCapabilities: {},
  });
  check(init.protocolVersion === 1, `protocol version ${init.protocolVersion}`);
  check(init.agentInfo?.name === "crew", `agent info ${JSON.stringify(init.agentInfo)}`);

  // A team run in project A: a plan, progress, output, and the end of the turn.
  const a = await ctx.request(methods.agent.session.new, { cwd: projectA, mcpServers: [] });
  const paired = await ctx.request(methods.agent.session.prompt, {
    sessionId: a.sessionId,
    prompt: [{ type: "text", text: "/run pair" }],
  });
  check(paired.stopReason === "end_turn", `/run pair stopped with ${paired.stopReason}`);
  const plans = (updates.get(a.sessionId) ?? []).filter((u) => u.sessionUpdate === "plan");
  check(plans.length >= 2, `${plans.length} plan updates`);
  const lastPlan = plans[plans.length - 1].entries;
  check(
    JSON.stringify(lastPlan.map((e) => [e.content, e.status]).sort()) ===
      JSON.stringify([["left", "completed"], ["right", "completed"]]),
    `last plan ${JSON.stringify(lastPlan)}`,
  );
  const pairText = transcript(a.sessionId);
  for (const expected of ["[left] hello from left", "[right] hello from right", "left succeeded", "right succeeded", "completed"]) {
    check(pairText.includes(expected), `no ${JSON.stringify(expected)} in ${JSON.stringify(pairText)}`);
  }

  // An agent asks (`crew ask`): the editor answers, the agent goes on with the answer.
  const asked = await ctx.request(methods.agent.session.prompt, {
    sessionId: a.sessionId,
    prompt: [{ type: "text", text: "/run ask" }],
  });
  check(asked.stopReason === "end_turn", `/run ask stopped with ${asked.stopReason}`);
  check(questions.length === 1, `questions: ${JSON.stringify(questions)}`);
  check(questions[0].sessionId === a.sessionId, "the question came in its session");
  check(questions[0].title.includes("ship it?"), `question ${JSON.stringify(questions[0])}`);
  check(JSON.stringify(questions[0].options) === JSON.stringify(["yes", "no"]), "yes or no");
  const askText = transcript(a.sessionId);
  check(askText.includes("[asker] answer: yes"), `no answer in ${JSON.stringify(askText)}`);
  check(askText.includes("asker succeeded"), `asker did not succeed: ${JSON.stringify(askText)}`);

  // The work of a task of this folder, as git diff shows it; another folder has no such task.
  const diff = await ctx.request("_crew/diff", { sessionId: a.sessionId, agent: "left" });
  check(diff.patch.includes("+hello from left"), `_crew/diff: ${JSON.stringify(diff)}`);
  check(diff.branch.endsWith("-left"), `diff branch ${diff.branch}`);

  // A second folder: its session sees its own task only.
  const b = await ctx.request(methods.agent.session.new, { cwd: projectB, mcpServers: [] });
  const solo = await ctx.request(methods.agent.session.prompt, {
    sessionId: b.sessionId,
    prompt: [{ type: "text", text: "echo solo > solo.txt && echo solo done" }],
  });
  check(solo.stopReason === "end_turn", `plain prompt stopped with ${solo.stopReason}`);
  const soloText = transcript(b.sessionId);
  check(soloText.includes("[task] solo done"), `no solo output in ${JSON.stringify(soloText)}`);
  check(!/left|right/.test(soloText), `project B saw project A: ${JSON.stringify(soloText)}`);
  // The turn says where the work is: on the task's branch, not "no changes".
  check(/crew\/[^\s]*-task/.test(soloText), `the plain prompt's branch in ${JSON.stringify(soloText)}`);

  // `/task <agent> <prompt>` in a folder with no default agent runs for that agent.
  const named = await ctx.request(methods.agent.session.prompt, {
    sessionId: a.sessionId,
    prompt: [{ type: "text", text: "/task shell echo via > via.txt && echo via done" }],
  });
  check(named.stopReason === "end_turn", `/task stopped with ${named.stopReason}`);
  check(transcript(a.sessionId).includes("[shell] via done"), `no /task output in ${JSON.stringify(transcript(a.sessionId))}`);

  // Cancel mid-run: the turn ends `cancelled`, the work is kept on the task's branch.
  const slow = ctx.request(methods.agent.session.prompt, {
    sessionId: a.sessionId,
    prompt: [{ type: "text", text: "/run slow" }],
  });
  await waitFor(a.sessionId, (u) => text(u).includes("[slow] started"));

  // crew's own operations, as extension methods, scoped to the session's folder.
  // The host publishes its listing a moment after an agent's first output can reach the
  // editor: asked again until it shows, for at most 10 s.
  let idsA = [];
  let listedA;
  for (let tries = 0; tries < 100 && !idsA.includes("slow"); tries++) {
    if (tries > 0) await new Promise((resolve) => setTimeout(resolve, 100));
    listedA = await ctx.request("_crew/agents", { sessionId: a.sessionId });
    idsA = listedA.agents.map((agent) => agent.task_id);
  }
  check(idsA.includes("slow"), `_crew/agents in A: ${JSON.stringify(idsA)}`);
  // The rows of `crew agents list --json`, not another shape.
  const slowRow = listedA.agents.find((agent) => agent.task_id === "slow");
  check(
    slowRow.live === true && slowRow.state === "running" && "last_line" in slowRow && "task_status" in slowRow,
    `_crew/agents rows are crew agents list --json's: ${JSON.stringify(slowRow)}`,
  );
  const listedB = await ctx.request("_crew/agents", { sessionId: b.sessionId });
  check(
    !listedB.agents.some((agent) => ["slow", "left", "right"].includes(agent.task_id)),
    `_crew/agents in B shows A's: ${JSON.stringify(listedB)}`,
  );
  const steered = await ctx.request("_crew/steer", {
    sessionId: a.sessionId,
    agent: "slow",
    message: "keep going",
  });
  check(typeof steered.agent_id === "string" && steered.agent_id.endsWith(":slow"), `steer: ${JSON.stringify(steered)}`);
  let foreignDiff;
  try {
    await ctx.request("_crew/diff", { sessionId: b.sessionId, agent: "left" });
  } catch (error) {
    foreignDiff = error;
  }
  check(foreignDiff?.code === -32602, `B reading A's diff: ${JSON.stringify(foreignDiff)}`);
  let foreign;
  try {
    await ctx.request("_crew/stop", { sessionId: b.sessionId, agent: "slow" });
  } catch (error) {
    foreign = error;
  }
  check(foreign?.code === -32602, `B stopping A's agent: ${JSON.stringify(foreign)}`);
  // A refusal says why where an editor shows it: the error's own message.
  check(
    typeof foreign?.message === "string" && foreign.message !== "Invalid params" && foreign.message.includes("slow"),
    `B stopping A's agent says why: ${JSON.stringify(foreign)}`,
  );

  await ctx.notify(methods.agent.session.cancel, { sessionId: a.sessionId });
  const cancelled = await slow;
  check(cancelled.stopReason === "cancelled", `cancel: stopped with ${cancelled.stopReason}`);

  // Bad input gets JSON-RPC errors, and the connection goes on.
  let unknown;
  try {
    await ctx.request("crew/no_such_method", {});
  } catch (error) {
    unknown = error;
  }
  check(unknown?.code === -32601, `unknown method: ${JSON.stringify(unknown)}`);
  let badSession;
  try {
    await ctx.request(methods.agent.session.prompt, {
      sessionId: "no-such-session",
      prompt: [{ type: "text", text: "/run pair" }],
    });
  } catch (error) {
    badSession = error;
  }
  check(badSession?.code === -32602, `unknown session: ${JSON.stringify(badSession)}`);
  const again = await ctx.request(methods.agent.session.new, { cwd: projectB, mcpServers: [] });
  check(typeof again.sessionId === "string", "the connection still works after errors");

  // Each folder's runs are its sessions to list and load; another folder's are not there.
  check(init.agentCapabilities?.loadSession === true, "loadSession capability");
  const listA = await ctx.request(methods.agent.session.list, { cwd: projectA });
  const titlesA = listA.sessions.map((session) => session.title).sort();
  check(
    JSON.stringify(titlesA) ===
      JSON.stringify(["adhoc-shell — completed", "ask — completed", "pair — completed", "slow — cancelled"]),
    `sessions of A: ${JSON.stringify(titlesA)}`,
  );
  const listB = await ctx.request(methods.agent.session.list, { cwd: projectB });
  check(listB.sessions.length === 1, `sessions of B: ${JSON.stringify(listB)}`);
  check(
    !listB.sessions.some((session) => listA.sessions.some((other) => other.sessionId === session.sessionId)),
    "B lists none of A's runs",
  );
  const pairRun = listA.sessions.find((session) => session.title.startsWith("pair")).sessionId;
  await ctx.request(methods.agent.session.load, { sessionId: pairRun, cwd: projectA, mcpServers: [] });
  const replayed = transcript(pairRun);
  check(replayed.includes("left succeeded") && replayed.includes("right succeeded"), `replay: ${JSON.stringify(replayed)}`);
  const replayedPlans = (updates.get(pairRun) ?? []).filter((u) => u.sessionUpdate === "plan");
  check(replayedPlans.length === 1 && replayedPlans[0].entries.every((e) => e.status === "completed"), "replayed plan");
  // A run going on in another process: loading it replays what happened and follows the rest.
  const detached = execFileSync(crew, ["run", "--detach", "--agent", "shell", "sleep 1; echo late"], {
    cwd: projectB,
    encoding: "utf8",
  }).trim();
  const liveRun = `run:${detached}`;
  await ctx.request(methods.agent.session.load, { sessionId: liveRun, cwd: projectB, mcpServers: [] });
  await waitFor(liveRun, (u) => text(u).includes(`run ${detached} completed`));
  check(transcript(liveRun).includes("shell succeeded"), `followed: ${JSON.stringify(transcript(liveRun))}`);

  let crossLoad;
  try {
    await ctx.request(methods.agent.session.load, { sessionId: pairRun, cwd: projectB, mcpServers: [] });
  } catch (error) {
    crossLoad = error;
  }
  check(crossLoad?.code === -32602, `loading A's run from B: ${JSON.stringify(crossLoad)}`);

  return {
    sessionA: a.sessionId,
    sessionB: b.sessionId,
    cancelledTranscript: transcript(a.sessionId).split("\n").filter((l) => l.includes("slow")),
  };
});

child.stdin.end();
await new Promise((resolve) => child.on("exit", resolve));
clearTimeout(deadline);
process.stdout.write(JSON.stringify({ ok: true, ...seen }) + "\n");
