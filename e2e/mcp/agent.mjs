// The agent of the MCP end-to-end test: a client on the official TypeScript SDK that
// spawns `airlock mcp` as its MCP server (the way any MCP client takes a command), in front
// of the real @modelcontextprotocol/server-filesystem. Run by scripts/test-mcp-e2e.sh.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const { AIRLOCK_BIN, MCP_POLICY, FILES_DIR, AIRLOCK_URL, AIRLOCK_API_KEY } = process.env;
for (const [k, v] of Object.entries({ AIRLOCK_BIN, MCP_POLICY, FILES_DIR, AIRLOCK_URL, AIRLOCK_API_KEY })) {
  if (!v) throw new Error(`${k} is not set`);
}

async function startAgent(runId, crashAt) {
  const env = { ...process.env, AIRLOCK_RUN_ID: runId };
  delete env.AIRLOCK_TEST_CRASH_AT;
  if (crashAt) env.AIRLOCK_TEST_CRASH_AT = crashAt;
  const transport = new StdioClientTransport({
    command: AIRLOCK_BIN,
    args: ["mcp", "--config", MCP_POLICY, "--lease", "2s", "--wait", "30s"],
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
{
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
{
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
}

// 3. A client that takes a URL: the gateway on --listen (streamable HTTP).
{
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
