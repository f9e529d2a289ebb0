// The agent of the MCP end-to-end test: a client on the official TypeScript SDK that
// spawns `airlock mcp` as its MCP server (the way any MCP client takes a command), in front
// of the real @modelcontextprotocol/server-filesystem. Run by scripts/test-mcp-e2e.sh.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { execFileSync } from "node:child_process";

const { AIRLOCK_BIN, MCP_POLICY, MCP_POLICY2, FILES_DIR, AIRLOCK_URL, AIRLOCK_API_KEY, AIRLOCK_DB } = process.env;
for (const [k, v] of Object.entries({ AIRLOCK_BIN, MCP_POLICY, MCP_POLICY2, FILES_DIR, AIRLOCK_URL, AIRLOCK_API_KEY, AIRLOCK_DB })) {
  if (!v) throw new Error(`${k} is not set`);
}

async function startAgent(runId, crashAt, { policy = MCP_POLICY, lease = "2s", wait = "30s" } = {}) {
  const env = { ...process.env, AIRLOCK_RUN_ID: runId };
  delete env.AIRLOCK_TEST_CRASH_AT;
  if (crashAt) env.AIRLOCK_TEST_CRASH_AT = crashAt;
  const transport = new StdioClientTransport({
    command: AIRLOCK_BIN,
    args: ["mcp", "--config", policy, "--lease", lease, "--wait", wait],
    env,
    stderr: "inherit",
  });
  const client = new Client({ name: "e2e-agent", version: "1.0.0" });
  await client.connect(transport);
  return { client, transport };
}

// crash kills the gateway as a power cut would: its lease is not released.
async function crash(agent) {
  process.kill(agent.transport.pid, "SIGKILL");
  await agent.client.close().catch(() => {});
}

// E2E_ONLY=4,6 runs only those parts (to watch one fail); all run by default.
const only = (n) => !process.env.E2E_ONLY || process.env.E2E_ONLY.split(",").includes(String(n));

const text = (r) => r.content.filter((c) => c.type === "text").map((c) => c.text).join("\n");

async function events(runId) {
  const r = await fetch(`${AIRLOCK_URL}/v1/runs/${runId}/events?limit=100`, {
    headers: { Authorization: `Bearer ${AIRLOCK_API_KEY}` },
  });
  assert.equal(r.status, 200);
  const body = await r.json();
  return (body.events ?? body).filter((e) => e.kind === "tool_call").map((e) => `${e.detail.tool}:${e.detail.decision}`);
}

const write = (p, content) => ({ name: "write_file", arguments: { path: p, content } });

// 1. The agent writes a file, reads it, is refused an unclassified tool, crashes and
//    restarts: the same write_file is answered from the ledger, never performed again.
if (only(1)) {
  const a = path.join(FILES_DIR, "a.txt");
  const first = await startAgent("e2e-a");
  const tools = (await first.client.listTools()).tools;
  const names = tools.map((t) => t.name);
  assert.ok(names.includes("write_file") && names.includes("read_text_file"), `tools: ${names}`);
  assert.match(tools.find((t) => t.name === "move_file").description, /not classified/);

  const wrote = await first.client.callTool(write(a, "one"));
  assert.ok(!wrote.isError, text(wrote));
  const read = await first.client.callTool({ name: "read_text_file", arguments: { path: a } });
  assert.equal(text(read), "one");
  const moved = await first.client.callTool({ name: "move_file", arguments: { source: a, destination: a + ".moved" } });
  assert.ok(moved.isError && text(moved).includes("unclassified_tool"), text(moved));
  assert.ok(fs.existsSync(a) && !fs.existsSync(a + ".moved"), "move_file reached the server");

  fs.writeFileSync(a, "changed by someone else"); // a second write would overwrite this
  await crash(first);

  const second = await startAgent("e2e-a"); // waits for the dead gateway's lease to lapse
  const again = await second.client.callTool(write(a, "one"));
  assert.ok(!again.isError, text(again));
  assert.equal(text(again), text(wrote), "the replayed answer is the recorded one");
  assert.deepEqual(again.structuredContent, wrote.structuredContent);
  assert.equal(fs.readFileSync(a, "utf8"), "changed by someone else", "write_file was performed a second time");
  await second.client.close();
  assert.deepEqual(await events("e2e-a"), [
    "write_file:executed", "read_text_file:passed", "move_file:refused_unclassified", "write_file:replayed",
  ]);
  console.log("ok: write_file performed once across an agent crash and restart; reads pass; unclassified refused");
}

// 2. The gateway dies after the server wrote the file but before airlock recorded it:
//    the restarted agent's identical call is never sent; it gets reconcile_first and the
//    effect waits for a person.
if (only(2)) {
  const b = path.join(FILES_DIR, "b.txt");
  const first = await startAgent("e2e-b", "mcp_after_upstream");
  await assert.rejects(first.client.callTool(write(b, "two"), undefined, { timeout: 20000 }));
  await first.client.close().catch(() => {});
  assert.equal(fs.readFileSync(b, "utf8"), "two");
  fs.writeFileSync(b, "changed by someone else");

  const second = await startAgent("e2e-b");
  for (let i = 0; i < 2; i++) {
    const r = await second.client.callTool(write(b, "two"));
    assert.ok(r.isError && text(r).includes("reconcile_first"), text(r));
  }
  assert.equal(fs.readFileSync(b, "utf8"), "changed by someone else", "write_file was sent again after the crash");
  await second.client.close();
  const r = await fetch(`${AIRLOCK_URL}/v1/runs/e2e-b/ledger`, { headers: { Authorization: `Bearer ${AIRLOCK_API_KEY}` } });
  const statuses = r.status === 200 ? (await r.json()).effects.map((e) => e.status) : [];
  if (r.status !== 200) {
    // No ledger document is saved by the gateway; read the effect through the run instead.
    const run = await (await fetch(`${AIRLOCK_URL}/v1/runs/e2e-b`, { headers: { Authorization: `Bearer ${AIRLOCK_API_KEY}` } })).json();
    statuses.push(...run.effects.map((e) => e.state));
  }
  assert.deepEqual(statuses, ["unknown"]);
  console.log("ok: a crash between the write and its confirmation leads to reconcile_first; no second write");

  // A person checks, finds the file written, and resolves it as sent without a provider
  // id, with the CLI as docs/mcp.md shows: the same call is then answered from the ledger
  // (performed, no result recorded), not refused on every later call.
  const listed = execFileSync(AIRLOCK_BIN, ["effects", "list", "--key", "e2e-b", "--state", "unknown", "--database-url", AIRLOCK_DB], { encoding: "utf8" });
  const effectRow = listed.trim().split("\n")[1].split(/\s+/);
  execFileSync(AIRLOCK_BIN, ["effects", "resolve", effectRow[0], "--outcome", "sent", "--no-provider-id", "--note", "b.txt was written",
    "--database-url", AIRLOCK_DB, "--config", MCP_POLICY2], { encoding: "utf8" });
  const third = await startAgent("e2e-b");
  for (let i = 0; i < 2; i++) {
    const r = await third.client.callTool(write(b, "two"));
    assert.ok(!r.isError, text(r));
    assert.match(text(r), /performed earlier.*no result was recorded/s);
    assert.equal(r._meta?.["airlock/replayed"]?.result_recorded, false, JSON.stringify(r._meta));
  }
  assert.equal(fs.readFileSync(b, "utf8"), "changed by someone else", "write_file was sent again after the resolve");
  await third.client.close();
  console.log("ok: resolved as sent without a provider id (CLI), the same call is answered from the ledger");
}

// 3. A client that takes a URL: the gateway on --listen (streamable HTTP).
if (only(3)) {
  const { spawn } = await import("node:child_process");
  const { StreamableHTTPClientTransport } = await import("@modelcontextprotocol/sdk/client/streamableHttp.js");
  const port = Number(process.env.MCP_HTTP_PORT);
  const env = { ...process.env, AIRLOCK_RUN_ID: "e2e-c" };
  delete env.AIRLOCK_TEST_CRASH_AT;
  const gw = spawn(AIRLOCK_BIN, ["mcp", "--config", MCP_POLICY, "--listen", `127.0.0.1:${port}`, "--lease", "2s"], { env, stdio: ["ignore", "inherit", "inherit"] });
  try {
    const client = new Client({ name: "e2e-http-agent", version: "1.0.0" });
    let connected = false;
    for (let i = 0; i < 100 && !connected; i++) {
      try {
        await client.connect(new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${port}/`)));
        connected = true;
      } catch {
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    assert.ok(connected, "could not reach airlock mcp --listen");
    const c = path.join(FILES_DIR, "c.txt");
    const w = await client.callTool(write(c, "three"));
    assert.ok(!w.isError, text(w));
    fs.writeFileSync(c, "changed by someone else");
    const again = await client.callTool(write(c, "three"));
    assert.equal(text(again), text(w));
    assert.equal(fs.readFileSync(c, "utf8"), "changed by someone else");
    await client.close();
    console.log("ok: over streamable HTTP (--listen) the same write_file is performed once");
  } finally {
    gw.kill("SIGTERM");
  }
}

// The next parts run behind the real @modelcontextprotocol/server-memory and
// server-everything (MCP_POLICY2).
const memory = { start: (runId, opts = {}) => startAgent(runId, undefined, { policy: MCP_POLICY2, ...opts }) };
const entity = (name) => ({ name: "create_entities", arguments: { entities: [{ name, entityType: "person", observations: ["likes tea"] }] } });
const names = async (client) => {
  const g = await client.callTool({ name: "read_graph", arguments: {} });
  return JSON.parse(text(g)).entities.map((e) => e.name);
};

// 4. A replay is marked in _meta; an identical call on purpose carries a call key.
//    create → delete → create again: without a key the third call is a replay (the
//    upstream is not called, and the answer says so); with a new key it is performed.
if (only(4)) {
  const a = await memory.start("e2e-d");
  const created = await a.client.callTool(entity("ana"));
  assert.ok(!created.isError, text(created));
  assert.equal(created._meta?.["airlock/replayed"], undefined, "a performed call is marked replayed");
  const deleted = await a.client.callTool({ name: "delete_entities", arguments: { entityNames: ["ana"] } });
  assert.ok(!deleted.isError, text(deleted));
  assert.deepEqual(await names(a.client), []);

  const replayed = await a.client.callTool(entity("ana"));
  assert.ok(!replayed.isError, text(replayed));
  const mark = replayed._meta?.["airlock/replayed"];
  assert.ok(mark && mark.effect_id.startsWith("mcp.create_entities.") && mark.result_recorded === true, JSON.stringify(replayed._meta));
  assert.deepEqual(await names(a.client), [], "the replay reached the upstream");

  const again = await a.client.callTool({ ...entity("ana"), _meta: { "airlock/call_key": "ana-again-1" } });
  assert.ok(!again.isError, text(again));
  assert.equal(again._meta?.["airlock/replayed"], undefined);
  assert.deepEqual(await names(a.client), ["ana"], "the call with a new key did not reach the upstream");
  const sameKey = await a.client.callTool({ ...entity("ana"), _meta: { "airlock/call_key": "ana-again-1" } });
  assert.ok(sameKey._meta?.["airlock/replayed"], "the same key again was performed again");
  await a.client.close();
  assert.deepEqual(await events("e2e-d"), [
    "create_entities:executed", "delete_entities:executed", "read_graph:passed", "create_entities:replayed", "read_graph:passed",
    "create_entities:executed", "read_graph:passed", "create_entities:replayed",
  ]);
  console.log("ok: replays are marked in _meta; a call key performs an identical create again (server-memory)");
}

// 5. A client that times out a slow effect (server-everything's long-running operation)
//    gets its progress meanwhile; the operation finishes and is confirmed anyway, and the
//    client's retry is answered from the ledger instead of becoming unknown.
if (only(5)) {
  const a = await memory.start("e2e-e");
  const op = { name: "trigger-long-running-operation", arguments: { duration: 2, steps: 4 } };
  const progress = [];
  await assert.rejects(a.client.callTool(op, undefined, { timeout: 1200, onprogress: (p) => progress.push(p) }), /timed out|Timeout/i);
  assert.ok(progress.length >= 1 && progress[0].total === 4, `progress relayed: ${JSON.stringify(progress)}`);
  const retry = await a.client.callTool(op, undefined, { timeout: 30000 });
  assert.ok(!retry.isError, text(retry));
  assert.match(text(retry), /completed/i);
  assert.ok(retry._meta?.["airlock/replayed"], `the retry was not answered from the ledger: ${JSON.stringify(retry._meta)}`);
  await a.client.close();
  assert.deepEqual(await events("e2e-e"), ["trigger-long-running-operation:executed", "trigger-long-running-operation:replayed"]);
  console.log(`ok: a timed-out slow effect is confirmed anyway (${progress.length} progress notifications relayed); its retry is answered from the ledger`);
}

// 6. A gateway that exits cleanly (its client closes stdin) releases the run's lease: the
//    next gateway on the run goes on at once. One that is SIGKILLed keeps it, and the
//    next is refused within --wait.
if (only(6)) {
  const opts = { lease: "60s", wait: "3s" };
  const first = await memory.start("e2e-f", opts);
  assert.ok(!(await first.client.callTool(entity("bo"))).isError);
  await first.client.close();
  const second = await memory.start("e2e-f", opts);
  const r = await second.client.callTool(entity("cy"));
  assert.ok(!r.isError, `after a clean exit: ${text(r)}`);
  await crash(second);
  const third = await memory.start("e2e-f", opts);
  const held = await third.client.callTool(entity("di"));
  assert.ok(held.isError && text(held).includes("lease_held"), text(held));
  await third.client.close();
  console.log("ok: a clean exit releases the lease (the next gateway goes on at once); a SIGKILL keeps it");
}

// 7. Resources, resource templates and prompts pass through: a resource link a tool
//    returns is read back through the gateway.
if (only(7)) {
  const a = await memory.start("e2e-g");
  const listed = (await a.client.listResources()).resources.map((r) => r.uri);
  assert.ok(listed.some((u) => u.startsWith("demo://resource/static/")), `resources: ${listed}`);
  const links = await a.client.callTool({ name: "get-resource-links", arguments: { count: 2 } });
  const link = links.content.find((c) => c.type === "resource_link");
  assert.ok(link, JSON.stringify(links.content));
  const read = await a.client.readResource({ uri: link.uri });
  assert.equal(read.contents[0].uri, link.uri);
  const dynamic = await a.client.readResource({ uri: "demo://resource/dynamic/text/7" });
  assert.ok(dynamic.contents[0].text.length > 0);
  const prompt = await a.client.getPrompt({ name: "args-prompt", arguments: { city: "Lyon" } });
  assert.match(JSON.stringify(prompt.messages), /Lyon/);
  await a.client.close();
  assert.deepEqual(await events("e2e-g"), ["get-resource-links:passed", "resources/read:passed", "resources/read:passed", "prompts/get:passed"]);
  console.log("ok: resources (a tool's resource link read back), templates and prompts pass through (server-everything)");
}
